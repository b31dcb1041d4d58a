"""The quality stage inside ``prepare``: removals under their rule's name with the measured
value, every document's metrics in the work dir, exact accounting, C4's line drops as text
overrides, per-source settings (short fortunes kept under their own rules while the job's
defaults remove the others), and the same hash whatever the parallelism."""
import glob
import json
import os

import pyarrow.parquet as pq
import pytest

from test_quality import prose

pytestmark = pytest.mark.slow

FORTUNES = ["A fool and his money are soon parted.", "Fortune favours the bold and the brave.",
            "Still waters run deep in the quiet river.", "Every cloud has a silver lining somewhere.",
            "The early bird catches the worm each morning.", "Actions speak louder than words.",
            "Where there is smoke there is fire.", "Yes.", "Look before you leap over the garden wall.",
            "Honesty is the best policy for a traveller."]
OTHER_FORTUNES = ["Time and tide wait for no man.", "A stitch in time saves nine.",
                  "Birds of a feather flock together.", "Hi.", "Better late than never, said the teacher."]


def _write(path, texts):
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("quality-corpus")
    pages = [prose(i) for i in range(20)]
    pages += [prose(50) + "\n\nLorem ipsum dolor sit amet, consectetur adipiscing elit.",  # c4:lorem_ipsum
              "\n\n".join([prose(51, 1, 2)] * 3),  # gopher_repetition:dup_para_frac
              prose(52) + "\nPlease enable JavaScript to view the comments.\nShare this"]  # kept, two lines dropped
    _write(d / "pages.jsonl", pages)
    _write(d / "fortunes.jsonl", FORTUNES)
    _write(d / "other.jsonl", OTHER_FORTUNES)
    return d


def _job(corpus, out, **over):
    from gristmill.pipeline.config import PrepareConfig

    short = {"gopher_repetition": {"enabled": False}, "c4": {"enabled": False}, "fineweb": {"enabled": False},
             "gopher_quality": {"min_doc_words": 3, "min_stop_words": 0}}
    d = {"inputs": [str(corpus / "pages.jsonl"), str(corpus / "other.jsonl"),
                    {"path": str(corpus / "fortunes.jsonl"), "min_chars": 5, "language_threshold": 0.0, "quality": short}],
         "output": {"store": str(out / "store"), "dataset": "q"}, "work_dir": str(out / "work"),
         "quality": {}, "split": {"validation_fraction": 0.0},
         "tokenizer": {"vocab_size": 300, "sample_bytes": 100_000}, "pack": {"seq_len": 32, "shard_bytes": 20_000}, **over}
    return PrepareConfig.from_dict(d)


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    from gristmill.pipeline.executor import prepare

    out = tmp_path_factory.mktemp("quality-run")
    return prepare(_job(corpus, out), quiet=True)


def _removed(run):
    with open(os.path.join(run.run_dir, "removed.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_removals_carry_their_rule_and_value_and_the_accounting_is_exact(run):
    a = run.report["accounting"]
    assert a["balanced"] and a["input"] == 20 + 3 + len(FORTUNES) + len(OTHER_FORTUNES)
    quality = [r for r in _removed(run) if r["stage"] == "quality"]
    assert not [r for r in _removed(run) if "text" in r]  # removed.jsonl has no texts (inspect removed reads the parquet)
    by_id = {r["id"]: r for r in quality}
    assert by_id["pages.jsonl:20"]["reason"] == "c4:lorem_ipsum"
    assert by_id["pages.jsonl:21"]["reason"] == "gopher_repetition:dup_para_frac"
    assert json.loads(by_id["pages.jsonl:21"]["detail"]) == {"value": pytest.approx(2 / 3), "threshold": 0.3}
    assert not any(i.startswith("pages.jsonl:") and int(i.split(":")[1]) < 20 for i in by_id)  # clean pages kept
    counts = {}
    for r in quality:
        counts[r["reason"]] = counts.get(r["reason"], 0) + 1
    assert run.report["stats"]["quality"]["removed"] == counts
    assert all(a["removed"][k] == v for k, v in counts.items())


def test_every_document_keeps_its_metrics_in_the_work_dir(run):
    t = pq.read_table(glob.glob(os.path.join(run.run_dir, "quality", "*.parquet")))
    stats = run.report["stats"]["quality"]
    assert t.num_rows == stats["documents_in"]
    rows = {r["id"]: r for r in t.to_pylist()}
    assert rows["pages.jsonl:21"]["reason"] == "gopher_repetition:dup_para_frac"
    assert rows["pages.jsonl:21"]["gopher_repetition:dup_para_frac"] == pytest.approx(2 / 3)
    assert rows["pages.jsonl:0"]["reason"] is None and rows["pages.jsonl:0"]["gopher_quality:word_count"] >= 50
    # the fortunes' own settings turned C4 off for them: no C4 metric measured
    fortune = next(r for i, r in rows.items() if i.startswith("fortunes.jsonl:"))
    assert fortune["c4:sentences"] is None and fortune["gopher_quality:word_count"] is not None


def test_c4_line_drops_reach_the_published_text(run):
    over = pq.read_table(glob.glob(os.path.join(run.run_dir, "overrides", "quality", "*.parquet"))).to_pylist()
    assert [o["id"] for o in over] == ["pages.jsonl:22"]
    assert "JavaScript" not in over[0]["text"] and "Share this" not in over[0]["text"]
    assert run.report["stats"]["quality"]["detail"]["texts_shortened"] == 1


def test_per_source_settings_keep_short_fortunes_the_job_default_removes(run):
    removed = {r["id"]: r for r in _removed(run)}
    with open(os.path.join(run.run_dir, "quarantine.jsonl")) as f:
        quarantined = {(os.path.basename(q["source"]), q["position"]): q["reason"] for q in map(json.loads, f)}
    assert quarantined == {("fortunes.jsonl", FORTUNES.index("Yes.")): "empty"}  # min_chars 5 there, 1 elsewhere
    fortunes = [f"fortunes.jsonl:{i}" for i, t in enumerate(FORTUNES) if t != "Yes."]
    assert not any(removed.get(i, {}).get("reason") == "language_score" for i in fortunes)  # threshold 0 there
    assert [i for i in fortunes if i in removed] == []
    other = [f"other.jsonl:{i}" for i in range(len(OTHER_FORTUNES))]
    assert all(i in removed for i in other)  # the job's defaults: too short for Gopher (or for language ID)
    assert any(removed[i]["stage"] == "quality" for i in other)


def test_same_hash_whatever_the_parallelism(run, corpus, tmp_path):
    from gristmill.pipeline.executor import prepare

    other = prepare(_job(corpus, tmp_path, runner={"concurrency": 1}, partitioning={"records_per_batch": 3, "partition_bytes": 1}), quiet=True)
    assert other.run_dir != run.run_dir and other.report["stats"]["quality"]["documents_in"] > 0
    assert other.manifest_sha256 == run.manifest_sha256
