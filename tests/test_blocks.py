"""Partitions in blocks (issue 32): a per-partition step runs a task per block of consecutive
partitions, which writes one file per kind of output for all of them; a partition's rows are a
range of that file. The blocks depend on the partition count alone; a block is finished or redone
whole; a run leaves at most 6 files per partition (markers and task logs included) from 256
partitions on, with every stage on, and publishes the same manifest as with a file per partition."""
from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest
import yaml

from gristmill.errors import GristmillError
from gristmill.pipeline.runner import SerialRunner, batches_of, blocks_of, run_batch
from gristmill.pipeline.workdir import (BlockOutputs, PartPath, WorkDir, block_parts, iter_batches, part_name,
                                        read_parquet)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

SCHEMA = pa.schema([("id", pa.string()), ("order", pa.int64())])


def _rows(part: int, n: int) -> pa.Table:
    return pa.table({"id": [f"{part}-{i}" for i in range(n)], "order": [(part << 32) | i for i in range(n)]}, schema=SCHEMA)


def test_a_block_file_holds_each_partition_apart(tmp_path):
    wd = WorkDir(str(tmp_path), block_parts=4)
    sizes = {4: 3, 5: 0, 6: 2500, 7: 1}
    with BlockOutputs():
        for p, n in sizes.items():
            w = wd.part(wd.docs(p), SCHEMA, row_group_size=1000)
            if p == 7:
                w.append(_rows(p, n).to_pylist()[0])  # row by row, as ParquetPart
            else:
                w.write(_rows(p, n))
            w.commit()
    assert len({str(wd.docs(p)) for p in sizes}) == 1 and str(wd.docs(3)) != str(wd.docs(4))
    assert sorted(os.listdir(tmp_path / "docs")) == ["block-00001.parquet"]  # one file for four partitions
    for p, n in sizes.items():
        assert read_parquet(wd.docs(p)).equals(_rows(p, n))
        got = [r for b in iter_batches(wd.docs(p), ["id"], batch_size=700) for r in b.column("id").to_pylist()]
        assert got == _rows(p, n).column("id").to_pylist()
    # a filter prunes inside the partition's rows only
    late = read_parquet(wd.docs(6), ["id"], filters=[("order", ">=", (6 << 32) | 2490)])
    assert late.column("id").to_pylist() == [f"6-{i}" for i in range(2490, 2500)]
    assert read_parquet(wd.docs(4), filters=[("order", ">=", 6 << 32)]).num_rows == 0
    # the whole file (what a global step reads once): every partition's rows in partition order
    whole = read_parquet(WorkDir.whole_files([wd.docs(p) for p in sizes])[0])
    assert whole.column("id").to_pylist() == [i for p, n in sizes.items() for i in _rows(p, n).column("id").to_pylist()]
    with pytest.raises(ValueError, match="partition 8 is not in the block file"):
        read_parquet(PartPath(str(wd.docs(4)), 8))


def test_a_block_task_reads_earlier_block_files_through_a_bounded_set_of_open_files(tmp_path, monkeypatch):
    wd = WorkDir(str(tmp_path), block_parts=1)
    for p in range(5):  # an earlier step's files: five blocks
        with BlockOutputs():
            w = wd.part(wd.keys(p), SCHEMA)
            w.write(_rows(p, p + 1))
            w.commit()
    monkeypatch.setattr(BlockOutputs, "READERS", 2)
    with BlockOutputs() as block:
        for p in [0, 1, 2, 0, 4, 3, 4]:  # more files than it keeps open, some read again after being closed
            assert read_parquet(wd.keys(p)).equals(_rows(p, p + 1))
            assert [r for b in iter_batches(wd.keys(p), ["id"]) for r in b.column("id").to_pylist()] == \
                _rows(p, p + 1).column("id").to_pylist()
            assert len(block._opened) <= 2


def test_a_block_that_fails_commits_nothing_and_writes_only_inside_its_task(tmp_path):
    wd = WorkDir(str(tmp_path), block_parts=2)
    with pytest.raises(RuntimeError, match="killed"):
        with BlockOutputs():
            w = wd.part(wd.docs(0), SCHEMA)
            w.write(_rows(0, 3))
            w.commit()
            raise RuntimeError("killed")  # partition 1 never ran: the block's files must not look finished
    assert glob.glob(str(tmp_path / "docs" / "*")) == []
    with pytest.raises(RuntimeError, match="outside its block"):
        wd.part(wd.docs(0), SCHEMA)
    with BlockOutputs(), pytest.raises(RuntimeError, match="written twice"):
        wd.part(wd.docs(0), SCHEMA).commit()
        wd.part(wd.docs(0), SCHEMA)


def test_the_blocks_depend_on_the_partition_count_alone(tmp_path):
    assert [block_parts(p) for p in (1, 16, 40, 250, 256, 4000)] == [1, 1, 2, 15, 16, 16]
    wd = WorkDir(str(tmp_path), block_parts=block_parts(250))
    items = [{"name": part_name(p), "part": p} for p in range(250)]
    want = [list(range(i, min(i + 15, 250))) for i in range(0, 250, 15)]
    assert [[it["part"] for it in b] for b in blocks_of(items, wd)] == want
    for limit in (1, 2, 4, 64):  # batches in flight: twice the workers; a batch holds whole blocks
        batches = [[it["part"] for it in b] for b in batches_of(items, limit, wd)]
        assert [p for b in batches for p in b] == list(range(250))
        assert all(b[0] % 15 == 0 and (b[-1] + 1) % 15 in (0, 250 % 15) for b in batches), batches
    # the run fixes them once: a resumed run finds the blocks its finished tasks wrote
    run = WorkDir(str(tmp_path / "run"))
    run.set_blocks(250)
    assert WorkDir(str(tmp_path / "run")).block_parts == 15
    with pytest.raises(GristmillError, match="says 15 partitions a block"):
        run.set_blocks(4000)


def test_a_block_is_finished_or_redone_whole(tmp_path):
    wd = WorkDir(str(tmp_path), block_parts=4)
    calls = []

    def fn(item):
        calls.append(item["part"])
        w = wd.part(wd.keys(item["part"]), SCHEMA)
        w.write(_rows(item["part"], 2))
        w.commit()
        return {"rows": 2}

    items = [{"name": part_name(p), "part": p} for p in range(8)]
    assert SerialRunner(wd).run("s", items, fn) == [{"rows": 2, **s} for s in SerialRunner(wd).run("s", items, fn)]
    assert calls == list(range(8))
    assert sorted(os.listdir(tmp_path / "_done" / "s")) == ["part-00000.batch.json", "part-00004.batch.json"]
    os.remove(tmp_path / "_done" / "s" / "part-00004.batch.json")  # kill -9 after the block's files, before its marker
    calls.clear()
    SerialRunner(wd).run("s", items, fn)
    assert calls == [4, 5, 6, 7]
    # a marker naming only some of a block's partitions never stands for the block: it is redone whole
    os.remove(tmp_path / "_done" / "s" / "part-00004.batch.json")
    wd.mark_batch_done("s", {"part-00005": {"rows": 2}})
    calls.clear()
    SerialRunner(wd).run("s", items, fn)
    assert calls == [4, 5, 6, 7]
    assert [read_parquet(wd.keys(p)).num_rows for p in range(8)] == [2] * 8


def test_a_batch_of_blocks_commits_each_block_and_a_retry_skips_the_committed_ones(tmp_path):
    wd = WorkDir(str(tmp_path), block_parts=2)
    calls, dies = [], [True]

    def fn(item):
        calls.append(item["part"])
        if item["part"] == 3 and dies and dies.pop():
            raise KeyboardInterrupt  # the worker dies inside the second block, on the first attempt
        w = wd.part(wd.tokens(item["part"]), SCHEMA)
        w.write(_rows(item["part"], 1))
        w.commit()
        return {"part": item["part"]}

    items = [{"name": part_name(p), "part": p} for p in range(4)]
    with pytest.raises(KeyboardInterrupt):
        run_batch(fn, items, wd, "s")
    assert sorted(os.listdir(tmp_path / "_done" / "s")) == ["part-00000.batch.json"]  # the first block only
    assert sorted(os.listdir(tmp_path / "tokens")) == ["block-00000.parquet"]
    calls.clear()
    assert [s["part"] for s in run_batch(fn, items, wd, "s")] == [0, 1, 2, 3]
    assert calls == [2, 3]  # the retry (attempt 2) ran the second block alone
    assert sorted(os.listdir(tmp_path / "_done" / "s")) == ["part-00000.batch.json", "part-00002.batch.json"]


# -- whole runs: every stage on, P = 16 (a block per partition) and P = 256 (16 a block) ----------
FILES = 512


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from corpus_split import write_split_corpus
    from gristmill.pipeline.demo_corpus import stdlib_paragraphs

    root = tmp_path_factory.mktemp("blocks-corpus")
    info = write_split_corpus(str(root / "corpus"), files=FILES, docs_per_file=1, paragraphs_per_doc=3)
    evals = root / "evals.jsonl"
    evals.write_text("".join(json.dumps({"id": f"q{i}", "text": p}) + "\n" for i, p in enumerate(stdlib_paragraphs()[::400])))
    return root, info, str(evals)


def _job_file(corpus, out, partitions: int) -> str:
    from workdir_files import job_dict

    root, info, evals = corpus
    path = out / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(str(root / "corpus"), evals, str(out), partitions, FILES, info["file_bytes"])))
    return str(path)


def _prepare(job: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gristmill", "prepare", job], capture_output=True, text=True, timeout=600)


def _report(out) -> dict:
    (path,) = glob.glob(str(out / "work" / "*" / "report.json"))
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    out = {}
    for p in (16, 256):
        d = tmp_path_factory.mktemp(f"P{p}")
        done = _prepare(_job_file(corpus, d, p))
        assert done.returncode == 0, done.stderr[-3000:]
        out[p] = (d, _report(d))
    return out


@pytest.mark.slow
def test_at_most_6_files_per_partition_from_256_partitions_with_the_same_manifest(runs):
    from workdir_files import count_files

    (d16, r16), (d256, r256) = runs[16], runs[256]
    assert r256["manifest_sha256"] == r16["manifest_sha256"] and r256["accounting"] == r16["accounting"]
    assert r256["accounting"]["balanced"] and sum(r256["accounting"]["removed"].values()) > 0
    (run_dir,) = glob.glob(str(d256 / "work" / "*"))
    counts = count_files(run_dir)
    assert sum(counts.values()) <= 6 * 256, counts  # a file per partition and kind was 24 a partition here
    for kind in ("docs", "keys", "tokens", "quarantine"):
        assert counts[kind] == -(-256 // 16), (kind, counts)  # a file per block: 256 partitions in 16 blocks
    assert {n for s in os.listdir(os.path.join(run_dir, "removed"))
            for n in os.listdir(os.path.join(run_dir, "removed", s))} <= {f"{v}block-{b:05d}.parquet" for b in range(16)
                                                                          for v in ("", "val-")}


@pytest.mark.slow
def test_kill_9_inside_a_block_step_then_rerun_gives_the_same_hash(corpus, runs, tmp_path):
    """Killed while the blocks of a per-partition step are being written (after the first block's
    marker), the rerun skips the committed blocks, redoes the rest whole and publishes the
    uninterrupted run's manifest with the same accounting."""
    job = _job_file(corpus, tmp_path, 256)
    proc = subprocess.Popen([sys.executable, "-m", "gristmill", "prepare", job], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    pattern = str(tmp_path / "work" / "*" / "_done" / "quality" / "*.batch.json")
    while time.time() < deadline and proc.poll() is None and not glob.glob(pattern):
        time.sleep(0.005)
    time.sleep(random.Random(32).uniform(0, 0.05))
    assert proc.poll() is None, "prepare finished before the kill"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    committed = len(glob.glob(pattern))
    assert 0 < committed < 16, committed  # inside the step: some blocks done, some not
    rerun = _prepare(job)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"[quality] {committed * 16} of 256 tasks already done" in rerun.stderr, rerun.stderr[-3000:]
    got, want = _report(tmp_path), runs[256][1]
    assert got["manifest_sha256"] == want["manifest_sha256"] and got["accounting"] == want["accounting"]


def test_a_run_dir_of_the_layout_before_blocks_is_named_not_mistaken_for_nothing(tmp_path):
    """`inspect removed` on a run dir written before the block layout says so in one line (it said
    the path was no run dir at all); a path with no run dir still gets the general message."""
    from gristmill.errors import UsageError
    from gristmill.pipeline.removals import find_runs

    old = tmp_path / "work" / "0123456789abcdef"
    (old / "docs").mkdir(parents=True)
    pq_path = old / "docs" / "part-00000.parquet"
    import pyarrow.parquet as pq

    pq.write_table(_rows(0, 2), pq_path)
    for where in (tmp_path / "work", old):
        with pytest.raises(UsageError, match="is a run dir of an earlier gristmill") as e:
            find_runs(str(where))
        assert str(old) in str(e.value)
    with pytest.raises(UsageError, match="neither a run dir"):
        find_runs(str(tmp_path / "empty"))
