"""Run a step's tasks, each committed with a completion marker, with live progress.

Every stage, per-partition maps and global steps alike, is a list of tasks over files in the
work dir: a partition, a range of hash buckets, a range of partitions. A task is a plain
function of its item (a small dict with a unique ``name``) that writes its outputs atomically
and returns JSON-able stats; the runner commits those stats as the task's marker
(``_done/<step>/<name>.json``) and skips every task whose marker exists, so a rerun after
``kill -9`` redoes only unfinished tasks inside every step. Task lists are defined by the data
(partitions, bucket ranges), never by the number of workers, so results never depend on it.
A per-partition step (items with a ``part``) runs block by block (``WorkDir.block_of``): a
block's partitions run in one worker, write one file per kind of output together
(``workdir.BlockOutputs``) and commit with one marker, so they are finished or redone together.

Every runner is a ``Runner`` (here: the commit protocol every runner shares, ``run_one`` and
``run_batch``, and ``SerialRunner``, in this process, in item order, for unit tests of a stage and
small tools); the others are one module each in ``pipeline.runners`` (``local``: a pool of worker
processes on this machine; ``ray``: plain Ray tasks with ``num_cpus=1``), registered by their
``kind`` in ``pipeline.runners.RUNNERS``. A runner class owns its start-up and shutdown
(``Runner.start(cfg, ...)``, a context manager over the job's ``runner:`` section); the same
batches, markers and outputs on each (tests/test_runner_conformance.py). Stages only see ``Runner``.
"""
from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import socket
import time
import traceback
import warnings
from typing import Callable, ClassVar, Iterator

from gristmill.errors import GristmillError, is_disk_error, os_error_text, store_close_noise_to_the_log
from gristmill.manifests.storage import Store

from .progress import Progress
from .workdir import BlockOutputs, WorkDir

logger = logging.getLogger(__name__)  # gristmill.pipeline.runner
Measure = Callable[[dict], tuple[int, int]]
MAX_BATCH = 64  # items per Ray task at most: a step of thousands of tiny tasks pays Ray's cost per batch


class TaskError(GristmillError):
    """A task failed for good: its step, its item, the partition's input files and its log."""


class TaskFailed(Exception):
    """Raised in a worker when an item's function raised (its traceback is in the item's log)."""

    def __init__(self, name: str, cause: str, log: str):
        super().__init__(name, cause, log)
        self.name, self.cause, self.log = name, cause, log

    def __str__(self) -> str:
        return self.cause


class _TaskLog(logging.FileHandler):
    """The task's log file, created on the first warning or error only (most tasks write none)."""

    def __init__(self, path: str):
        super().__init__(path, delay=True, encoding="utf-8")
        self.setLevel(logging.WARNING)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def _open(self):
        os.makedirs(os.path.dirname(self.baseFilename), exist_ok=True)
        return super()._open()

    def handleError(self, record) -> None:
        """A log that cannot be written (a full or read-only work dir) is off for the rest of the
        task, quietly: the task's own failure is the error to report, not a traceback per record
        (logging's default printed dozens of "--- Logging error ---" before the one line)."""
        self.setLevel(logging.CRITICAL + 1)

    def close(self) -> None:
        try:
            super().close()  # flushes what is buffered: the full disk may refuse it here
        except OSError:
            self.setLevel(logging.CRITICAL + 1)


@contextlib.contextmanager
def task_log(path: str, store: Store | None = None):
    """Python logging (WARNING and up) and warnings of the code inside go to ``path`` of ``store``
    (None: the store of ``path``)."""
    store = store or Store.from_url(path)
    if not store.is_local:  # an object store: the log is kept in memory and uploaded whole at the end
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        buf, handler = None, _TaskLog(path)
    root = logging.getLogger()
    root.addHandler(handler)
    logging.captureWarnings(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            yield handler
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        handler.close()
        if buf is not None and buf.getvalue():
            store.put(path, buf.getvalue().encode())


def record_attempt(wd: WorkDir, step: str, name: str) -> int:
    """Claim the next attempt number of a batch (``logs/<step>/<name>.attempt-N``, created
    exclusively, holding ``<host> <pid>`` of this worker): a retried batch, by Ray or by a rerun,
    leaves N > 1 and the driver counts it."""
    who = f"{socket.gethostname()} {os.getpid()}\n".encode()
    n = 1
    while not wd.create_new(wd.attempt(step, name, n), who):
        n += 1
    return n


def run_one(fn: Callable[[dict], dict], item: dict, wd: WorkDir, step: str, sync: bool = True,
            commit: bool = True) -> dict:
    """One task: ``fn(item)``, then its marker (after its outputs are committed: the marker is the
    commit; ``commit=False`` leaves that to the batch's marker). Its warnings and errors go to its
    log; an exception becomes ``TaskFailed``."""
    t0, c0 = time.perf_counter(), time.process_time()
    log = wd.log(step, item["name"])
    with task_log(log, wd.store):
        failed = None
        try:
            stats = fn(item)
        except Exception as e:
            logger.error("%s %s failed:\n%s", step, item["name"], traceback.format_exc())
            cause = os_error_text(e) if is_disk_error(e) else str(e)  # a full disk: say what to do about it
            failed = TaskFailed(item["name"], f"{type(e).__name__}: {cause}", log)
        if failed is not None:
            # Raised here, not in the except clause, it holds no reference to the failure (its
            # __context__), and the collection frees what the failure's frames held while this log is
            # open: an upload whose store went away fails to close now, into this log (errors.py).
            gc.collect()
            raise failed
    stats = {**stats, "_seconds": time.perf_counter() - t0, "_cpu_seconds": time.process_time() - c0}
    if commit:
        wd.mark_done(step, item["name"], stats, sync=sync)
    return stats


def run_batch(fn: Callable[[dict], dict], items: list[dict], wd: WorkDir, step: str) -> list[dict]:
    """Several items in one worker (a runner's unit of work), committed together by one batch
    marker (``_done/<step>/<first>.batch.json``, fsynced) once all their outputs are written: one
    marker file for a batch of tasks, not one each (a file create and rename per task was a
    good part of a tiny task's fixed cost). A batch of partitions is whole blocks (``batches_of``),
    each run and committed on its own (``_run_block``). Another batch killed before its marker is redone whole (deterministic tasks
    rewrite the same bytes); a rerun with another batch size still finds every committed task,
    since ``WorkDir.finished`` reads batch markers by task name. When an item raises, the items
    before it are committed first, so only the failed one is redone. A batch of one item writes
    that item's own marker. A retried batch (attempt > 1: Ray after its worker died) skips the
    items a marker already lists."""
    store_close_noise_to_the_log(logging.WARNING, worker=True)  # a worker's: into the task's log, off the terminal
    if per_partition(items):
        return [s for block in blocks_of(items, wd) for s in _run_block(fn, block, wd, step)]
    if len(items) == 1:
        return list(_run_items(fn, items, wd, step))
    # The driver hands out only tasks without a marker, so a first attempt has none to skip.
    finished = wd.finished(step) if record_attempt(wd, step, items[0]["name"]) > 1 else {}
    stats: dict[str, dict] = {}
    try:
        for it in items:
            if it["name"] not in finished:
                stats[it["name"]] = run_one(fn, it, wd, step, commit=False)
    finally:
        if stats:  # the items that finished, committed even when a later one raised
            wd.mark_batch_done(step, stats)
    return [stats.get(it["name"]) or finished[it["name"]] for it in items]


def per_partition(items: list[dict]) -> bool:
    """Whether a step's items are partitions (each with its ``part``): they run, write and commit
    by blocks (``WorkDir.block_of``), never alone."""
    return bool(items) and all("part" in it for it in items)


def _run_block(fn: Callable[[dict], dict], items: list[dict], wd: WorkDir, step: str) -> list[dict]:
    """The partitions of one block (``items``, in order, all of them): each item's outputs go into
    the block's files (``BlockOutputs``), committed together when every item has run, then one
    batch marker commits the block (fsynced). An item that raises leaves nothing committed: the
    block is redone whole, as is one killed at any point before its marker. A retried batch (attempt
    > 1) skips a block its marker commits."""
    if record_attempt(wd, step, items[0]["name"]) > 1:
        finished = wd.finished(step)
        if all(it["name"] in finished for it in items):
            return [finished[it["name"]] for it in items]
    with BlockOutputs():
        stats = {it["name"]: run_one(fn, it, wd, step, commit=False) for it in items}
    wd.mark_batch_done(step, stats)
    return [stats[it["name"]] for it in items]


def _run_items(fn: Callable[[dict], dict], items: list[dict], wd: WorkDir, step: str):
    """Items one after another, each committed by its own marker (the last one synced); a retried
    run of them (attempt > 1) skips the items a marker lists."""
    finished = wd.finished(step) if record_attempt(wd, step, items[0]["name"]) > 1 else {}
    for i, it in enumerate(items):
        yield finished.get(it["name"]) or run_one(fn, it, wd, step, sync=i == len(items) - 1)


class Runner:
    """Runs a step's unfinished tasks; counts what ran (CPU seconds), what was resumed and retried.

    A runner kind declares ``kind`` (its ``runner.kind`` in the job), ``options`` (the other keys
    of the ``runner:`` section it reads; any other key set in the job is refused) and
    ``retries_lost_workers`` (a batch whose worker dies is run again, up to ``runner.max_retries``),
    and owns its start-up and shutdown in ``start``."""

    kind: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()
    retries_lost_workers: ClassVar[bool] = False

    @classmethod
    @contextlib.contextmanager
    def start(cls, cfg, wd: WorkDir, progress: Progress | None = None,
              inputs: dict[int, list[str]] | None = None) -> Iterator["Runner"]:
        """The runner for the job's ``runner:`` section ``cfg`` (``pipeline.config.RunnerConfig``),
        stopped with whatever it started when the block ends."""
        runner = cls(wd, progress, inputs)
        try:
            yield runner
        finally:
            runner.close()

    def __init__(self, wd: WorkDir, progress: Progress | None = None, inputs: dict[int, list[str]] | None = None):
        self.wd, self.progress = wd, progress
        self.inputs = inputs or {}  # partition -> its input files, for error messages
        self.task_cpu_seconds = 0.0  # of every task this runner returned, resumed ones as recorded
        self.resumed_tasks = 0  # tasks found finished (marker present) when their step started
        self.retries: dict[str, int] = {}  # step -> attempts past each batch's first

    def run(self, step: str, items: list[dict], fn: Callable[[dict], dict], measure: Measure | None = None) -> list[dict]:
        """``fn(item)`` for every item whose marker is missing; all items' stats, in item order."""
        names = [it["name"] for it in items]
        if len(set(names)) != len(names):
            raise RuntimeError(f"{step}: task names are not unique")
        results: dict[str, dict] = {}
        todo = []
        finished = self.wd.finished(step)  # one listing of the step's markers, not a lookup per item
        if per_partition(items):  # a block's partitions are finished together or not at all
            blocks = {self.wd.block_of(it["part"]) for it in items if it["name"] not in finished}
            finished = {it["name"]: finished[it["name"]] for it in items if self.wd.block_of(it["part"]) not in blocks}
        for it in items:
            if (done := finished.get(it["name"])) is not None:
                results[it["name"]] = done
            else:
                todo.append(it)
        self.resumed_tasks += len(items) - len(todo)
        if self.progress is not None:
            self.progress.start(step, len(items), resumed=len(items) - len(todo), measure=measure)
        if todo:
            try:
                for it, stats in self._execute(step, todo, fn):
                    results[it["name"]] = stats
                    if self.progress is not None:
                        self.progress.advance(step, stats)
            except TaskFailed as e:
                raise self.error(step, next(it for it in todo if it["name"] == e.name), e.cause, e.log) from None
            finally:
                if retried := self._count_retries(step):
                    self.retries[step] = retried
        if self.progress is not None:
            self.progress.finish(step)
        out = [results[n] for n in names]
        self.task_cpu_seconds += sum(s.get("_cpu_seconds", 0.0) for s in out)
        return out

    def error(self, step: str, item: dict, cause: str, log: str | None) -> TaskError:
        where = ""
        if "part" in item:
            files = self.inputs.get(item["part"], [])
            shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
            where = f" (partition {item['part']}{': ' + shown if shown else ''})"
        log_part = f"; its log: {log}" if log and self.wd.exists(log) else ""
        return TaskError(f"{step}: task {item['name']}{where} failed: {cause}{log_part}")

    def _count_retries(self, step: str) -> int:
        try:
            names = self.wd.listdir(self.wd.logs(step))
        except FileNotFoundError:
            return 0
        return sum(1 for n in names if (a := WorkDir.attempt_of(n)) is not None and a[1] > 1)

    def _execute(self, step: str, todo: list[dict], fn):  # yields (item, stats) as tasks finish
        raise NotImplementedError

    def close(self) -> None:
        """Stop the runner's workers, if it has any (``start`` calls it when the run ends)."""

    def _lost_error(self, step: str, batch: list[dict], attempts: int, retries: int, e: BaseException) -> TaskError:
        """A batch whose worker died in each of its attempts: named by its first unfinished item."""
        first = next((it for it in batch if self.wd.done(step, it["name"]) is None), batch[0])
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return self.error(step, first, f"its worker died in each of its {attempts} attempt{'s' * (attempts > 1)} "
                                       f"(runner.max_retries: {retries}; {type(e).__name__}{': ' + why if why else ''})",
                          self.wd.log(step, first["name"]))


def blocks_of(items: list[dict], wd: WorkDir) -> list[list[dict]]:
    """Partition items grouped by their block (``WorkDir.block_of``), in order."""
    blocks: dict[int, list[dict]] = {}
    for it in items:
        blocks.setdefault(wd.block_of(it["part"]), []).append(it)
    return list(blocks.values())


def batches_of(todo: list[dict], limit: int, wd: WorkDir) -> list[list[dict]]:
    """A step's batches: consecutive items, at most MAX_BATCH (partitions: whole blocks, at least
    one), about four per batch slot (``limit`` batches in flight), so the load spreads. The
    batching never changes an output: a block's files are written by one task, whatever batch
    it runs in."""
    if per_partition(todo):
        blocks = blocks_of(todo, wd)
        size = max(1, min(MAX_BATCH // wd.block_parts, len(blocks) // (4 * limit)))
        return [[it for b in blocks[i:i + size] for it in b] for i in range(0, len(blocks), size)]
    size = max(1, min(MAX_BATCH, len(todo) // (4 * limit)))
    return [todo[i:i + size] for i in range(0, len(todo), size)]


class SerialRunner(Runner):
    """Every task in this process, one after another, as one batch (no Ray, no worker to lose)."""

    kind = "serial"

    def _execute(self, step, todo, fn):
        if per_partition(todo):
            for block in blocks_of(todo, self.wd):
                yield from zip(block, run_batch(fn, block, self.wd, step))
            return
        yield from zip(todo, _run_items(fn, todo, self.wd, step))
