"""Run a step's tasks as Ray tasks, each committed with a completion marker, with live progress.

Every stage, per-partition maps and global steps alike, is a list of tasks over files in the
work dir: a partition, a range of hash buckets, a range of partitions. A task is a plain
function of its item (a small dict with a unique ``name``) that writes its outputs atomically
and returns JSON-able stats; ``run_tasks`` commits those stats as the task's marker
(``_done/<step>/<name>.json``) and skips every task whose marker exists, so a rerun after
``kill -9`` redoes only unfinished tasks inside every step. Task lists are defined by the data
(partitions, bucket ranges), never by the number of workers, so results never depend on it.

Plain Ray tasks with ``num_cpus=1``: at most one worker process per CPU, none of Ray Data's
operator actors, and the items and stats that travel are a few hundred bytes each.
"""
from __future__ import annotations

import time
from typing import Callable

from .progress import Progress
from .workdir import WorkDir


def _run_one(fn: Callable[[dict], dict], item: dict, root: str, step: str) -> dict:
    wd = WorkDir(root)
    t0, c0 = time.perf_counter(), time.process_time()
    stats = fn(item)
    stats = {**stats, "_seconds": time.perf_counter() - t0, "_cpu_seconds": time.process_time() - c0}
    wd.mark_done(step, item["name"], stats)  # after the task's outputs are committed: the marker is the commit
    return stats


def run_tasks(ray, wd: WorkDir, step: str, items: list[dict], fn: Callable[[dict], dict], *,
              progress: Progress | None = None, measure: Callable[[dict], tuple[int, int]] | None = None,
              max_in_flight: int | None = None) -> list[dict]:
    """``fn(item)`` for every item whose marker is missing, as Ray tasks; all items' stats in order."""
    names = [it["name"] for it in items]
    if len(set(names)) != len(names):
        raise RuntimeError(f"{step}: task names are not unique")
    results: dict[str, dict] = {}
    todo = []
    for it in items:
        if (done := wd.done(step, it["name"])) is not None:
            results[it["name"]] = done
        else:
            todo.append(it)
    if progress is not None:
        progress.start(step, len(items), resumed=len(items) - len(todo), measure=measure)
    if todo:
        # SPREAD: tasks go to every node of a cluster, not first to fill the driver's node (Ray's
        # default), so a cluster's CPUs and local disks all work; on one machine it changes nothing.
        remote = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(_run_one)
        limit = max_in_flight or max(1, int(ray.available_resources().get("CPU", 1)) * 2)
        fn_ref = ray.put(fn)
        pending: dict = {}
        queue = iter(todo)
        while True:
            while len(pending) < limit and (it := next(queue, None)) is not None:
                pending[remote.remote(fn_ref, it, wd.root, step)] = it
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                it = pending.pop(ref)
                results[it["name"]] = stats = ray.get(ref)
                if progress is not None:
                    progress.advance(step, stats)
            if not ready and progress is not None:
                progress.tick(step)
    if progress is not None:
        progress.finish(step)
    return [results[n] for n in names]
