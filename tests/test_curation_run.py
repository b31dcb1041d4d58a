"""One small `prepare` run with every kind of removal, then what a user inspects: `gristmill
inspect removed` (a duplicate beside its survivor, the language filter's text), the PII
counts in the manifest, the url provenance and `manifest show`'s stage table."""
import json
import os
import random

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.demo_corpus import FOREIGN, near_duplicate, stdlib_paragraphs
    from gristmill.pipeline.executor import prepare

    tmp = tmp_path_factory.mktemp("curate")
    paras = stdlib_paragraphs()[:40]
    vocab = sorted({w for p in paras for w in p.split()})
    docs = [paras[2 * i] + "\n\n" + paras[2 * i + 1] for i in range(20)]
    docs[4] += " Write to maintainer@example.org or ping 8.8.8.8 (not 10.0.0.1)."
    near, _ = near_duplicate(docs[6], 0.85, random.Random(1), vocab)
    records = [{"text": t, "url": f"https://docs.example/{i}"} for i, t in enumerate(docs)]
    records += [{"text": docs[2]}, {"text": near}, {"text": FOREIGN["de"][0]}]  # 20: exact, 21: near, 22: German
    os.makedirs(tmp / "in")
    with open(tmp / "in" / "a.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    job = PrepareConfig.from_dict({
        "inputs": [str(tmp / "in" / "a.jsonl")], "output": {"store": str(tmp / "store"), "dataset": "d"},
        "work_dir": str(tmp / "work"), "split": {"validation_fraction": 0.0}, "fuzzy_dedup": {"threshold": 0.7},
        "tokenizer": {"vocab_size": 300, "sample_bytes": 100_000}, "pack": {"seq_len": 64, "shard_bytes": 1 << 16},
    })
    return prepare(job, quiet=True), tmp, docs, near


def _inspect(capsys, *args):
    from gristmill.cli import main

    assert main(["inspect", "removed", *args]) == 0
    return capsys.readouterr().out


def test_inspect_removed_shows_text_and_survivors(run, capsys):
    result, tmp, docs, near = run
    got = json.loads(_inspect(capsys, str(tmp / "work"), "--json"))  # the work dir: its one run
    assert got["run_dir"] == result.run_dir
    assert got["removed_by_reason"] == {"exact_duplicate": 1, "language": 1, "near_duplicate": 1}
    by_reason = {d["reason"]: d for d in got["documents"]}
    assert by_reason["language"]["text"].startswith("Die Mühle am Fluss") and by_reason["language"]["stage"] == "language"
    exact = by_reason["exact_duplicate"]
    assert (exact["id"], exact["text"], exact["survivor"]["id"], exact["survivor"]["text"]) == \
        ("a.jsonl:20", docs[2], "a.jsonl:2", docs[2])
    fuzzy = by_reason["near_duplicate"]
    assert (fuzzy["id"], fuzzy["text"], fuzzy["survivor"]["id"], fuzzy["survivor"]["text"]) == \
        ("a.jsonl:21", near, "a.jsonl:6", docs[6])
    assert fuzzy["survivor"]["url"] == "https://docs.example/6" and fuzzy["detail"]["similarity"] >= 0.7
    only = json.loads(_inspect(capsys, result.run_dir, "--reason", "near_duplicate", "--limit", "20", "--json"))
    assert [d["id"] for d in only["documents"]] == ["a.jsonl:21"]
    text = _inspect(capsys, result.run_dir, "--reason", "near_duplicate")
    assert "survivor a.jsonl:6" in text and " | " in text and docs[6].split()[0] in text
    from gristmill.cli import main

    assert main(["inspect", "removed", result.run_dir, "--reason", "nonsense"]) == 2
    assert "reasons there: exact_duplicate (1), language (1), near_duplicate (1)" in capsys.readouterr().err


def test_pii_counts_url_provenance_and_the_stage_table(run, capsys):
    from gristmill.cli import main
    from gristmill.manifests import load_manifest, read_doc_index

    result, tmp, docs, _ = run
    m = load_manifest(result.url).manifest
    assert m.stats["stages"]["pii"]["detail"] == {"replacements": {"email": 1, "ip": 1}, "documents_changed": 1}
    assert m.stats["accounting"]["balanced"]
    import pyarrow.parquet as pq

    (redacted,) = pq.read_table(os.path.join(result.run_dir, "overrides", "pii")).to_pylist()
    assert redacted["id"] == "a.jsonl:4" and redacted["text"].endswith("Write to <EMAIL> or ping <IP> (not 10.0.0.1).")
    urls = {s["doc_id"]: s["url"] for s in read_doc_index(os.path.join(result.url, m.doc_index.path)).to_pylist()}
    assert urls["a.jsonl:3"] == "https://docs.example/3" and urls["a.jsonl:0"] == "https://docs.example/0"
    assert main(["manifest", "show", result.url]) == 0
    out = capsys.readouterr().out
    assert "replaced email 1, ip 1" in out and "near_duplicate 1" in out and "[balanced]" in out
