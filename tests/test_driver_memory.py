"""The driver's memory does not grow with the partition count (issue 32, target 5: peak driver memory
flat from 200 MB to 2 GB of input, 93 -> 987 partitions). benchmarks/bench_driver_memory.py measures
the whole run (docs/benchmarks.md, "Driver memory against the partition count"); these pin the
driver-side pieces that are per partition, by the bytes they allocate (tracemalloc), not by time."""
from __future__ import annotations

import gc
import tracemalloc

import pytest

from gristmill.pipeline.executor import Executor
from gristmill.pipeline.partitions import Partition
from gristmill.pipeline.workdir import WorkDir

# every kind of removal file a run with every stage on lists at publish (removed.jsonl)
REMOVALS = [("language", ""), ("exact_dedup", ""), ("quality", ""), ("fuzzy_dedup", ""), ("decontaminate", ""),
            ("decontaminate", "val-"), ("pii", "")]


def _peak_bytes(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _publish_listing_peak(root: str, partitions: int) -> int:
    """Peak bytes the driver allocates writing quarantine.jsonl and removed.jsonl (their listing of
    every partition's block files) for a run of ``partitions`` partitions."""
    wd = WorkDir(root)
    wd.set_blocks(partitions)
    ex = Executor.__new__(Executor)  # only what _write_records reads: the work dir and the partitions
    ex.wd, ex.tasks = wd, [Partition(p, ()) for p in range(partitions)]
    return _peak_bytes(lambda: ex._write_records(REMOVALS))


def test_publish_lists_block_files_not_a_path_per_partition(tmp_path):
    """At publish the driver named every partition's file of every kind (P x kinds paths: ~2 KB a
    partition with every stage on); it names each block's file once (16 partitions a block from 256
    partitions on), so what it allocates grows by blocks, far below a path per partition."""
    small, big = 256, 8192
    # the partitions' own list (a record each) is the test's, outside the measurement
    a = _publish_listing_peak(str(tmp_path / "small"), small)
    b = _publish_listing_peak(str(tmp_path / "big"), big)
    per_partition = (b - a) / (big - small)
    assert per_partition < 200, f"{per_partition:.0f} bytes a partition at publish ({a:,} -> {b:,} bytes)"


def test_block_files_are_whole_files_of_every_partition(tmp_path):
    """``block_files`` lists what ``whole_files`` of every partition's path lists, in the same order."""
    for partitions in (1, 7, 255, 256, 1000):
        wd = WorkDir(str(tmp_path / f"p{partitions}"))
        wd.set_blocks(partitions)
        parts = list(range(partitions))
        for kind in (wd.quarantine, lambda p: wd.removed("decontaminate", p, "val-")):
            assert wd.block_files(kind, parts) == wd.whole_files([kind(p) for p in parts])
        assert wd.block_files(wd.docs, [3, 40, 41, 200]) == wd.whole_files([wd.docs(p) for p in (3, 40, 41, 200)])


def _prepare_heap_peak(root, info, files: int, partitions: int, out) -> tuple[int, str]:
    """The driver's (this process's) traced Python heap at its peak during a whole ``prepare`` of
    the split corpus in ``partitions`` partitions, above where it started; and the manifest hash.
    The local runner's workers are spawned processes: not traced."""
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import prepare

    job = {
        "inputs": [str(root / "*.jsonl")],
        "output": {"store": str(out / "store"), "dataset": "mem", "report_html": False},
        "work_dir": str(out / "work"),
        "language": {"allowed": ["en"], "threshold": 0.3},
        "fuzzy_dedup": {"threshold": 0.8},
        "decontaminate": {"eval_sets": [{"name": "qa", "path": str(root.parent / "evals.jsonl"), "id_field": "id"}]},
        "split": {"validation_fraction": 0.05},
        "tokenizer": {"vocab_size": 400, "sample_bytes": 200_000},
        "pack": {"seq_len": 64, "shard_bytes": 100_000},
        "runner": {"kind": "local", "num_cpus": 2},
        "partitioning": {"partition_bytes": files // partitions * info["file_bytes"]},
    }
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = prepare(PrepareConfig.from_dict(job), quiet=True)
        return tracemalloc.get_traced_memory()[1] - start, result.manifest_sha256
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_the_drivers_heap_does_not_grow_with_the_partition_count(tmp_path, monkeypatch):
    """The same data in 50 and in 500 partitions (every per-partition stage on: ten times the task
    items, stats records, markers and block files): the driver's Python heap peaks within 1.5 MB of
    each other (measured: +0.19 MB here, +0.3 MB from 100 to 1,000 partitions in
    bench_driver_memory.py). What it guards against: anything the driver keeps per task for the
    run; keeping every step's stats records to the end (``Runner.run``'s results) measured +2.9 MB
    here, and more with a real corpus's larger records."""
    import json

    from corpus_split import write_split_corpus
    from gristmill.pipeline.demo_corpus import stdlib_paragraphs

    monkeypatch.setenv("GRISTMILL_CODE_VERSION", "test_driver_memory")  # one manifest hash for every run
    files = 500
    info = write_split_corpus(str(tmp_path / "corpus"), files=files, docs_per_file=1, paragraphs_per_doc=2)
    with open(tmp_path / "evals.jsonl", "w") as f:
        for i, p in enumerate(stdlib_paragraphs()[::400]):
            f.write(json.dumps({"id": f"q{i}", "text": p}) + "\n")
    corpus = tmp_path / "corpus"
    _prepare_heap_peak(corpus, info, files, 50, tmp_path / "warm")  # imports, caches: what a first run adds once
    many, sha_many = _prepare_heap_peak(corpus, info, files, 500, tmp_path / "many")
    few, sha_few = _prepare_heap_peak(corpus, info, files, 50, tmp_path / "few")
    assert sha_many == sha_few
    assert many - few < 1_500_000, f"driver heap peak {few:,} bytes at 50 partitions, {many:,} at 500"
