"""Run a step's tasks, each committed with a completion marker, with live progress.

Every stage, per-partition maps and global steps alike, is a list of tasks over files in the
work dir: a partition, a range of hash buckets, a range of partitions. A task is a plain
function of its item (a small dict with a unique ``name``) that writes its outputs atomically
and returns JSON-able stats; the runner commits those stats as the task's marker
(``_done/<step>/<name>.json``) and skips every task whose marker exists, so a rerun after
``kill -9`` redoes only unfinished tasks inside every step. Task lists are defined by the data
(partitions, bucket ranges), never by the number of workers, so results never depend on it.

Two runners behind one interface (``Runner.run``): ``RayRunner`` (plain Ray tasks with
``num_cpus=1``: at most one worker process per CPU, none of Ray Data's operator actors) for
``prepare``, and ``SerialRunner`` (in this process, in item order) for unit tests of a stage
and small tools: the same markers and the same outputs.
"""
from __future__ import annotations

import time
from typing import Callable

from .progress import Progress
from .workdir import WorkDir

Measure = Callable[[dict], tuple[int, int]]


def run_one(fn: Callable[[dict], dict], item: dict, wd: WorkDir, step: str) -> dict:
    """One task: ``fn(item)``, then its marker (after its outputs are committed: the marker is the commit)."""
    t0, c0 = time.perf_counter(), time.process_time()
    stats = fn(item)
    stats = {**stats, "_seconds": time.perf_counter() - t0, "_cpu_seconds": time.process_time() - c0}
    wd.mark_done(step, item["name"], stats)
    return stats


class Runner:
    """Runs a step's unfinished tasks; counts what ran (CPU seconds) and what was resumed."""

    def __init__(self, wd: WorkDir, progress: Progress | None = None):
        self.wd, self.progress = wd, progress
        self.task_cpu_seconds = 0.0  # of every task this runner returned, resumed ones as recorded
        self.resumed_tasks = 0  # tasks found finished (marker present) when their step started

    def run(self, step: str, items: list[dict], fn: Callable[[dict], dict], measure: Measure | None = None) -> list[dict]:
        """``fn(item)`` for every item whose marker is missing; all items' stats, in item order."""
        names = [it["name"] for it in items]
        if len(set(names)) != len(names):
            raise RuntimeError(f"{step}: task names are not unique")
        results: dict[str, dict] = {}
        todo = []
        for it in items:
            if (done := self.wd.done(step, it["name"])) is not None:
                results[it["name"]] = done
            else:
                todo.append(it)
        self.resumed_tasks += len(items) - len(todo)
        if self.progress is not None:
            self.progress.start(step, len(items), resumed=len(items) - len(todo), measure=measure)
        if todo:
            for it, stats in self._execute(step, todo, fn):
                results[it["name"]] = stats
                if self.progress is not None:
                    self.progress.advance(step, stats)
        if self.progress is not None:
            self.progress.finish(step)
        out = [results[n] for n in names]
        self.task_cpu_seconds += sum(s.get("_cpu_seconds", 0.0) for s in out)
        return out

    def _execute(self, step: str, todo: list[dict], fn):  # yields (item, stats) as tasks finish
        raise NotImplementedError


class SerialRunner(Runner):
    """Every task in this process, one after another (no Ray)."""

    def _execute(self, step, todo, fn):
        for it in todo:
            yield it, run_one(fn, it, self.wd, step)


class RayRunner(Runner):
    """Ray tasks, at most ``max_in_flight`` submitted at once (default twice the cluster's CPUs)."""

    def __init__(self, ray, wd: WorkDir, progress: Progress | None = None, *, max_in_flight: int | None = None):
        super().__init__(wd, progress)
        self.ray, self.max_in_flight = ray, max_in_flight

    def _execute(self, step, todo, fn):
        ray = self.ray
        # SPREAD: tasks go to every node of a cluster, not first to fill the driver's node (Ray's
        # default), so a cluster's CPUs and local disks all work; on one machine it changes nothing.
        remote = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(run_one)
        limit = self.max_in_flight or max(1, int(ray.available_resources().get("CPU", 1)) * 2)
        fn_ref = ray.put(fn)
        pending: dict = {}
        queue = iter(todo)
        while True:
            while len(pending) < limit and (it := next(queue, None)) is not None:
                pending[remote.remote(fn_ref, it, self.wd, step)] = it
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                it = pending.pop(ref)
                yield it, ray.get(ref)
            if not ready and self.progress is not None:
                self.progress.tick(step)
