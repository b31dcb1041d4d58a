"""Document ids are unique by construction (issue 26): an id that several input records carry keeps
none of them, in one file or across partitions, and a run whose accounting fails publishes nothing."""
import json
import os

import pyarrow as pa
import pytest

from gristmill.pipeline.stages.unique_ids.tasks import ID_SCHEMA, ids_table, repeated

PROSE = ("The river runs past the old mill where farmers bring their grain every autumn and the miller weighs "
         "each sack before the stones turn it into flour for the bakers of the town, story {i}. ")


def _ids(rows):
    cols = {k: [r[i] for r in rows] for i, k in enumerate(["id", "order", "part", "bytes", "kept", "source", "position"])}
    return ids_table(cols)


def test_every_kept_copy_of_a_repeated_id_is_removed_with_where_the_first_is():
    t = _ids([("A", 0, 0, 10, True, "a.jsonl", 0), ("B", 1, 0, 11, True, "a.jsonl", 1), ("C", 2, 0, 12, True, "a.jsonl", 2),
              ("B", 5, 1, 13, True, "b.jsonl", 0), ("D", 6, 1, 14, False, "b.jsonl", 1), ("D", 7, 1, 15, True, "b.jsonl", 2),
              ("E", 8, 1, 16, False, "b.jsonl", 3), ("E", 9, 1, 17, False, "b.jsonl", 4)])
    out = repeated(t).to_pylist()
    # B: both copies; D: the copy the language filter kept (the other stays counted there); E: none kept
    assert [(r["id"], r["order"], r["reason"], r["stage"]) for r in out] == [
        ("B", 1, "duplicate_id", "unique_ids"), ("B", 5, "duplicate_id", "unique_ids"), ("D", 7, "duplicate_id", "unique_ids")]
    details = [json.loads(r["detail"]) for r in out]
    assert details[1] == {"copies": 2, "first": "a.jsonl record 1", "this": "b.jsonl record 0"}
    assert details[2]["first"] == "b.jsonl record 1" and [r["bytes"] for r in out] == [11, 13, 15]
    assert repeated(ID_SCHEMA.empty_table()).num_rows == 0


def test_a_run_whose_accounting_fails_publishes_nothing(tmp_path, monkeypatch):
    from gristmill.pipeline import executor as exe
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.stats import AccountingError

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    job = PrepareConfig.from_dict({"inputs": [str(tmp_path / "a.jsonl")], "output": {"store": str(tmp_path / "store"), "dataset": "d"},
                               "work_dir": str(tmp_path / "w")})
    ex = exe.Executor(job, quiet=True)
    bad = {"input": 3, "kept": 1, "removed": {"exact_duplicate": 1}, "quarantined": {}, "balanced": False}
    monkeypatch.setattr(exe, "manifest_stats", lambda *a: {"stages": {}, "accounting": bad})
    os.makedirs(ex.wd.root, exist_ok=True)
    with pytest.raises(AccountingError, match=r"input 3 records != kept 1 \+ removed 1 \+ quarantined 0; nothing was "
                                                  r"published"):
        ex._publish([], {"total": {}}, 0.0, {})
    assert not (tmp_path / "store" / "d").exists()
    assert json.load(open(os.path.join(ex.wd.root, "accounting.json"))) == bad


def _corpus(tmp_path):
    """Two files, ids from the data: B twice in a.jsonl, C in both files (another partition with
    small partition_bytes), and X an exact text copy of one of the B's."""
    os.makedirs(tmp_path / "in")
    a = [("A", PROSE.format(i=1)), ("B", PROSE.format(i=2)), ("B", PROSE.format(i=3)), ("C", PROSE.format(i=4)),
         ("X", PROSE.format(i=2))]
    b = [("C", PROSE.format(i=5)), ("D", PROSE.format(i=6))]
    for name, rows in (("a.jsonl", a), ("b.jsonl", b)):
        with open(tmp_path / "in" / name, "w") as f:
            for i, text in rows:
                f.write(json.dumps({"id": i, "text": text * 3}) + "\n")


@pytest.mark.slow
def test_repeated_ids_keep_none_of_their_documents_whatever_the_partitioning(tmp_path):
    from gristmill.manifests import load_manifest, read_doc_index
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import prepare

    _corpus(tmp_path)
    hashes = []
    for partition_bytes in (1, 1 << 20):  # one partition per file / both files in one
        job = PrepareConfig.from_dict({
            "inputs": [{"path": str(tmp_path / "in" / "*.jsonl"), "id_field": "id"}],
            "output": {"store": str(tmp_path / f"store-{partition_bytes}"), "dataset": "d"},
            "work_dir": str(tmp_path / "work"), "language": {"enabled": False}, "split": {"validation_fraction": 0.0},
            "tokenizer": {"vocab_size": 300, "sample_bytes": 100_000}, "pack": {"seq_len": 16, "shard_bytes": 4096},
            "partitioning": {"partition_bytes": partition_bytes}})
        result = prepare(job, quiet=True)
        m = load_manifest(result.url).manifest
        acc = m.stats["accounting"]
        # X (the text of the first B) stays: the B's no longer stand for it, nor it for them
        assert acc["balanced"] and acc["input"] == 7 and acc["removed"] == {"duplicate_id": 4} and acc["kept"] == 3
        docs = {r["doc_id"] for r in read_doc_index(os.path.join(result.url, m.doc_index.path)).to_pylist()}
        assert docs == {"A", "D", "X"}
        removed = [json.loads(line) for line in open(os.path.join(result.run_dir, "removed.jsonl"))]
        assert sorted((r["id"], r["reason"]) for r in removed) == [("B", "duplicate_id")] * 2 + [("C", "duplicate_id")] * 2
        c = [json.loads(r["detail"]) for r in removed if r["id"] == "C"]
        assert {d["this"].split("/")[-1] for d in c} == {"a.jsonl record 3", "b.jsonl record 0"}
        hashes.append(m.sha256)
    assert hashes[0] == hashes[1]
