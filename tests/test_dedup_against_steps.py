"""The bucketed match of dedup_against (issue 25), its steps run in this process: the same
verdicts as the in-memory match over the whole index, each bucket-range task reading only its
range (and no index rows where no new document has one), each fetch task only the row groups
holding its candidates, a corrupted index file refused by the task that reads it, and a rerun
that redoes nothing."""
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.manifests import dedup_index as dx
from gristmill.manifests.hashing import sha256_file
from gristmill.pipeline.stages.dedup_against import tasks as da
from gristmill.pipeline import dedup_index as di
from gristmill.pipeline.stages.fuzzy_dedup.config import FuzzyDedupConfig
from gristmill.pipeline.documents import DOC_SCHEMA, make_order, norm_hash
from gristmill.pipeline.runner import SerialRunner, TaskError
from gristmill.pipeline.survivors import Survivors
from gristmill.pipeline.workdir import WorkDir
from helpers import write_part

PARAMS = di.index_params(FuzzyDedupConfig())


def _edit(text, k, vocab, rng):
    w = text.split()
    for pos in rng.sample(range(len(w)), k):
        w[pos] = rng.choice(vocab) + "q"
    return " ".join(w)


@pytest.fixture(scope="module")
def corpus():
    """40 earlier documents (one without words) in 3 index files of 4-row row groups; 3 new
    partitions: exact, near and far copies of earlier documents, across all 3 files, fresh
    documents and one without words."""
    rng = random.Random(7)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(3000)]
    old = [" ".join(rng.choice(vocab) for _ in range(200)) for _ in range(39)] + ["!!! ..."]
    fresh = [" ".join(rng.choice(vocab) for _ in range(200)) for _ in range(4)]
    parts = [
        ["  " + old[3].upper(), _edit(old[5], 2, vocab, rng), fresh[0], "...", _edit(old[30], 1, vocab, rng)],
        [_edit(old[20], 3, vocab, rng), _edit(old[35], 1, vocab, rng), _edit(old[7], 60, vocab, rng), fresh[1]],
        [old[3], "!!! ...", fresh[2], _edit(old[14], 2, vocab, rng), _edit(old[14], 4, vocab, rng), fresh[3]],
    ]
    return old, parts


def _setup(tmp_path, corpus, monkeypatch):
    old, parts = corpus
    wd = WorkDir(str(tmp_path / "work"))
    for p, texts in enumerate(parts):
        n = len(texts)
        write_part(wd.docs(p), DOC_SCHEMA, pa.table({"id": [f"new-{p}-{i}" for i in range(n)], "order": [make_order(p, i) for i in range(n)],
                            "text": texts, "source": ["x"] * n, "position": list(range(n)), "lang": ["en"] * n,
                            "lang_score": [1.0] * n, "part": [p] * n, "bytes": [len(t.encode()) for t in texts],
                            "norm_hash": [norm_hash(t) for t in texts], "url": [None] * n}, schema=DOC_SCHEMA))
    monkeypatch.setattr(dx, "ROW_GROUP_ROWS", 4)  # several row groups a file: fetch reads only some
    files, tables = [], []
    for k, (lo, hi) in enumerate([(0, 14), (14, 27), (27, 40)]):
        t = di.index_rows(PARAMS, [f"old-{i:02d}" for i in range(lo, hi)], old[lo:hi])
        path = str(tmp_path / "store" / f"part-{k:05d}.parquet")
        dx.write(path, t)
        sha, size = sha256_file(path)
        files.append({"url": path, "path": f"dedup_index/part-{k:05d}.parquet", "sha256": sha, "bytes": size,
                      "rows": t.num_rows, "label": "old v1 (store)", "version": "old v1", "version_url": "store/old/v1",
                      "version_sha256": "f" * 64})
        tables.append(t.replace_schema_metadata(None))
    return wd, files, pa.concat_tables(tables)


def _run(wd, files, ranges, monkeypatch, runner=None):
    monkeypatch.setattr(da, "plan_bucket_ranges", lambda rows: ranges)
    return da.dedup_against(runner or SerialRunner(wd), Survivors(wd), [0, 1, 2], PARAMS, 0.8, files, 64)


def _removed(wd):
    rows = pa.concat_tables([pq.read_table(wd.removed("dedup_against", p)) for p in range(3)]).to_pylist()
    return {r["id"]: (r["reason"], json.loads(r["detail"])) for r in rows}


RANGES = [(0, 5000), (5000, 21000), (21000, 21001), (21001, 40000), (40000, 65536)]


def test_bucketed_steps_give_the_in_memory_verdicts(tmp_path, corpus, monkeypatch):
    old, parts = corpus
    wd, files, index = _setup(tmp_path, corpus, monkeypatch)
    flow, detail = _run(wd, files, RANGES, monkeypatch)
    got = _removed(wd)
    want = {}
    for p, texts in enumerate(parts):  # the reference: every new document against the whole index at once
        sk, has = di.sketch_texts(texts, PARAMS)
        m = di.match(PARAMS, 0.8, dx.exact_keys([norm_hash(t) for t in texts]), sk, has, index)
        for i in np.flatnonzero(m["row"] >= 0).tolist():
            want[f"new-{p}-{i}"] = (da.REASONS[m["kind"][i]], index.column("doc_id")[int(m["row"][i])].as_py(),
                                    round(float(m["similarity"][i]), 6))
    assert {k: (r, d["duplicate_of"], d["similarity"]) for k, (r, d) in got.items()} == want
    # what that is, by construction: exact copies (words or none: "..." and "!!! ..." normalise
    # alike) and near copies in every file
    assert {k: v[:2] for k, v in want.items()} == {
        "new-0-0": ("earlier_exact_duplicate", "old-03"), "new-0-1": ("earlier_near_duplicate", "old-05"),
        "new-0-3": ("earlier_exact_duplicate", "old-39"),
        "new-0-4": ("earlier_near_duplicate", "old-30"), "new-1-0": ("earlier_near_duplicate", "old-20"),
        "new-1-1": ("earlier_near_duplicate", "old-35"), "new-2-0": ("earlier_exact_duplicate", "old-03"),
        "new-2-1": ("earlier_exact_duplicate", "old-39"), "new-2-3": ("earlier_near_duplicate", "old-14"),
        "new-2-4": ("earlier_near_duplicate", "old-14")}
    assert all(d["earlier_version"] == "old v1" and d["earlier_sha256"] == "f" * 64 for _, d in got.values())
    assert flow.documents_in == 15 and flow.removed == {"earlier_exact_duplicate": 4, "earlier_near_duplicate": 6}
    assert detail["index_rows"] == 40 and detail["index_files"] == 3 and detail["candidate_pairs"] >= 10
    # the bucket ranges do not change the verdicts: one range gives the same files' rows
    wd2, files2, _ = _setup(tmp_path / "one", corpus, monkeypatch)
    _run(wd2, files2, [(0, 65536)], monkeypatch)
    assert _removed(wd2) == got


def test_a_bucket_task_reads_only_its_range_and_a_match_lands_in_it(tmp_path, corpus, monkeypatch):
    wd, files, _ = _setup(tmp_path, corpus, monkeypatch)
    from gristmill.pipeline import workdir

    reads = []
    real = workdir.read_parquet

    def spy(path, columns=None, filters=None, schema=None, store=None):  # every read of the run dir's files
        t = real(path, columns, filters, schema, store)
        reads.append((path, filters, t.num_rows))
        return t

    monkeypatch.setattr(workdir, "read_parquet", spy)
    _run(wd, files, RANGES, monkeypatch)
    keys = {name: pq.read_table(wd.scratch("dedup_against", "keys", name))
            for name in [f"part-{p:05d}" for p in range(3)] + [f"file-{k:05d}" for k in range(3)]}
    for t in keys.values():  # written sorted by bucket: a range's rows are a few row groups
        b = t.column("bucket").to_numpy()
        assert (np.diff(b) >= 0).all()
    marker = {k: wd.done("dedup_against.candidates", f"task-{k:03d}") for k in range(len(RANGES))}
    for k, (lo, hi) in enumerate(RANGES):
        mine = [(p, f, n) for p, f, n in reads if "/candidates/" not in p and f == [("bucket", ">=", lo), ("bucket", "<", hi)]]
        in_range = {name: int(((t.column("bucket").to_numpy() >= lo) & (t.column("bucket").to_numpy() < hi)).sum())
                    for name, t in keys.items()}
        new_rows = sum(in_range[f"part-{p:05d}"] for p in range(3))
        assert marker[k]["new_key_rows"] == new_rows
        if new_rows:  # every file read once, each its range's rows only
            assert sorted(p.rsplit("/", 1)[1] for p, _, _ in mine) == sorted(f"{n}.parquet" for n in keys)
            assert all(n == in_range[p.rsplit("/", 1)[1][:-8]] for p, _, n in mine)
            assert marker[k]["index_key_rows"] == sum(in_range[f"file-{f:05d}"] for f in range(3))
        else:  # no new document has a key here: the index is not read
            assert marker[k]["index_key_rows"] == 0
            assert sorted(p.rsplit("/", 1)[1] for p, _, _ in mine) == [f"part-{p:05d}.parquet" for p in range(3)]
    assert any(marker[k]["new_key_rows"] == 0 for k in range(len(RANGES)))  # the range (21000, 21001): empty
    # every index key row is read by exactly one task (one range), not once per task or per partition
    assert sum(m["index_key_rows"] for m in marker.values()) == sum(keys[f"file-{f:05d}"].num_rows for f in range(3))
    # the near copy new-1-1 of old-35 (file 2): the bucket of a band they share is in a task whose
    # candidates hold the pair, and only there
    new = keys["part-00001"].to_pandas()
    old = keys["file-00002"].to_pandas()
    o_new, ref_old = make_order(1, 1), (2 << da.FILE_SHIFT) | (35 - 27)
    shared = new[new.ref == o_new].merge(old[old.ref == ref_old], on=["band", "key", "bucket"])
    assert len(shared) >= 1
    holding = set()
    for k in range(len(RANGES)):
        c = pq.read_table(wd.scratch("dedup_against", "candidates", f"task-{k:03d}")).to_pandas()
        if ((c.order == o_new) & (c.ref == ref_old)).any():
            holding.add(k)
    assert holding == {k for k, (lo, hi) in enumerate(RANGES) if ((shared.bucket >= lo) & (shared.bucket < hi)).any()}
    # fetch: each file task reads its own pairs (file filter) and only the row groups holding them
    for f in range(3):
        m = wd.done("dedup_against.fetch", f"file-{f:05d}")
        c = pa.concat_tables([pq.read_table(wd.scratch("dedup_against", "candidates", f"task-{k:03d}"),
                                                       filters=[("file", "=", f)]) for k in range(len(RANGES))])
        rows = np.unique(c.column("ref").to_numpy() & ((1 << da.FILE_SHIFT) - 1))
        assert m["row_groups"] == -(-files[f]["rows"] // 4)
        assert m["row_groups_read"] == len(np.unique(rows // 4)) < m["row_groups"]
        assert m["pairs"] == len({(a, b) for a, b in zip(c.column("order").to_pylist(), c.column("ref").to_pylist())})
    # match: each partition reads only its rows of each fetch file
    for p in range(3):
        got = [(path, n) for path, flt, n in reads if "/fetched/" in path and flt == [("part", "=", p)]]
        assert len(got) == 3


def test_a_rerun_redoes_nothing_and_a_corrupted_index_file_is_refused_by_its_task(tmp_path, corpus, monkeypatch):
    from helpers import flip_byte

    wd, files, _ = _setup(tmp_path, corpus, monkeypatch)
    _run(wd, files, RANGES, monkeypatch)
    first = _removed(wd)
    again = SerialRunner(wd)
    _run(wd, files, RANGES, monkeypatch, runner=again)
    assert again.resumed_tasks == 6 + len(RANGES) + 3 + 3 and _removed(wd) == first
    wd2, files2, _ = _setup(tmp_path / "bad", corpus, monkeypatch)
    flip_byte(files2[1]["url"])
    with pytest.raises(TaskError, match=r"dedup_against.keys: task file-00001 failed: HashMismatchError: .*"
                                        r"part-00001.parquet: sha256 mismatch"):
        _run(wd2, files2, RANGES, monkeypatch)
    assert not wd2.exists(wd2.scratch("dedup_against", "index", "file-00001"))  # nothing unverified kept
