"""The quality stage's partition tasks in one process, outside Ray, as one worker runs them (issue 43).

    .venv/bin/python benchmarks/bench_quality_task.py --work-dir /tmp/gm-tp/200mb/runs/gristmill-TAG/work/KEY \
        [--blocks 0,2,4,6] [--profile]

Run it under the shared lock (it does not take it). It reads a finished ``bench_throughput.py gristmill``
run's work dir (``--work-dir``: the run dir holding ``docs/`` and ``removed/``), never writes there: its
``docs/``, ``layout.json`` and the language and exact-dedup removals are copied to a temporary run dir,
where the tasks write their outputs. The blocks' partitions run in turn (``--blocks``: a worker's share,
one block of partitions at a time, as the local runner hands them out), each task's CPU seconds
(``process_time``) printed with its rate per GB of quality input, then, on the same documents in the same
process (every kernel loaded), ``evaluate`` alone: what the stage adds to the rules. ``--profile``: cProfile
of the tasks, by own time. An older revision's tasks: ``PYTHONPATH=/tmp/gm-base-REV`` (the tree
``bench_throughput.py --base REV`` assembles), run from that directory.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import bench_throughput as bt

    from gristmill.pipeline import quality
    from gristmill.pipeline.stages.quality.config import QualityConfig
    from gristmill.pipeline.stages.quality.tasks import partition_task
    from gristmill.pipeline.survivors import Survivors
    from gristmill.pipeline import workdir
    from gristmill.pipeline.workdir import WorkDir

    if hasattr(workdir, "BlockOutputs"):  # an older revision (PYTHONPATH=/tmp/gm-base-REV, as bench_throughput.py --base builds it)
        BlockOutputs = workdir.BlockOutputs
    else:
        from gristmill.pipeline.block_files import BlockOutputs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--blocks", default="0,2,4,6")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="gm-quality-task-")
    for d in ("docs", "removed/language", "removed/exact_dedup"):
        shutil.copytree(os.path.join(a.work_dir, d), os.path.join(root, d))
    shutil.copy(os.path.join(a.work_dir, "layout.json"), root)
    cfg = QualityConfig.model_validate(bt.gristmill_job(a.work_dir, root, "", 2)["quality"])
    wd = WorkDir(root)
    survivors = Survivors(wd).after("language", removed=True).after("exact_dedup", removed=True)
    names = quality.metric_names(cfg)
    parts = [[p for p in range(b * wd.block_parts, (b + 1) * wd.block_parts)] for b in map(int, a.blocks.split(","))]
    texts, task_s, nbytes = [], 0.0, 0
    prof = cProfile.Profile() if a.profile else None
    for block in parts:
        with BlockOutputs():
            for p in block:
                docs = [t for t in survivors.docs(p, ["id", "source", "text"], 1024)]
                if not docs:
                    continue
                texts += [x for t in docs for x in t.column("text").to_pylist()]
                item = {"part": p, "sources": {s: 0 for t in docs for s in t.column("source").to_pylist()}}
                t0 = time.process_time()
                if prof:
                    prof.enable()
                stats = partition_task(item, [cfg.to_dict()], names, survivors)
                if prof:
                    prof.disable()
                dt = time.process_time() - t0
                task_s, nbytes = task_s + dt, nbytes + stats["bytes_in"]
                print(f"part {p}: {dt:.3f} CPU s, {stats['bytes_in'] / 1e6:.2f} MB, {dt / stats['bytes_in'] * 1e9:.0f} CPU-s per GB",
                      flush=True)
    sets = quality.rule_sets(cfg)
    t0 = time.process_time()
    for x in texts:
        quality.evaluate(x, cfg, sets)
    rules_s = time.process_time() - t0
    print(f"tasks: {task_s:.2f} CPU s for {nbytes / 1e6:.1f} MB, {task_s / nbytes * 1e9:.0f} CPU-s per GB; evaluate alone "
          f"on the same documents afterwards: {rules_s / nbytes * 1e9:.0f} CPU-s per GB")
    shutil.rmtree(root)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
