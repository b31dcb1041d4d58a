"""The ``local`` runner: a pool of worker processes on this machine (``runner.kind: local``, and
``auto`` without a Ray cluster named): no Ray daemons and no Ray start-up."""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
from typing import Callable, Iterator

from ..progress import Progress
from ..runner import Runner, TaskFailed, batches_of, run_batch
from ..workdir import WorkDir

logger = logging.getLogger(__name__)  # gristmill.pipeline.runners.local

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _worker_init(driver: int) -> None:
    """A pool worker's start. It ignores SIGINT: Ctrl-C reaches the whole foreground process group,
    and it is the driver's to handle (it kills the pool and says how to resume). On Linux it asks
    the kernel to SIGKILL it the moment its parent, the driver, dies (prctl(PR_SET_PDEATHSIG)
    through ctypes), so a ``kill -9`` of ``gristmill prepare`` leaves no worker writing in the
    work dir. The parent is the driver's thread that started the worker (the one running the
    runner: spawn starts workers from ``submit``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != driver:  # the driver died before the prctl took effect
            os._exit(1)


def _dumps(fn: Callable[[dict], dict]) -> bytes:
    """The step function for the workers: by reference with pickle where it can be (a module's
    function or a partial of one: every stage's), else by value with cloudpickle (a closure, a
    lambda). cloudpickle is Ray's copy, imported only then: importing it imports Ray (~60 MB in
    every process that loads the function)."""
    try:
        return pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        from ray import cloudpickle

        return cloudpickle.dumps(fn)


_loaded: tuple[bytes, Callable] | None = None  # in a worker: the step function it unpickled last


def _local_batch(payload: bytes, items: list[dict], wd: WorkDir, step: str) -> list[dict]:
    global _loaded
    if _loaded is None or _loaded[0] != payload:
        _loaded = (payload, pickle.loads(payload))
    return run_batch(_loaded[1], items, wd, step)


class LocalRunner(Runner):
    """Batches (as RayRunner's) on a pool of ``num_workers`` processes on this machine, at most
    ``max_in_flight`` batches at once (default twice the workers), results as they finish.

    The pool (``concurrent.futures.ProcessPoolExecutor``) is started on the first step and kept
    for the whole run. Its workers are *spawned*, not forked: the driver has threads (pyarrow's,
    fsspec's) that a fork would copy mid-state, and a spawned worker is the driver's own child,
    which its PR_SET_PDEATHSIG needs (a forkserver would put a server process between them).
    A worker that dies (kill -9, the OOM killer) breaks the pool: the pool is started again and
    every batch that was in flight runs again (its finished items are skipped by their markers;
    each new attempt is counted by ``record_attempt`` as under Ray), each batch at most
    ``max_retries`` times more; an exception an item raises is not retried. An error or Ctrl-C
    in the driver kills the workers at once."""

    kind, options, retries_lost_workers = "local", ("num_cpus", "concurrency", "max_retries"), True

    @classmethod
    @contextlib.contextmanager
    def start(cls, cfg, wd: WorkDir, progress: Progress | None = None,
              inputs: dict[int, list[str]] | None = None) -> Iterator["LocalRunner"]:
        runner = cls(wd, progress, num_workers=cfg.num_cpus, max_in_flight=cfg.concurrency, max_retries=cfg.max_retries,
                     inputs=inputs)
        try:
            yield runner
        finally:
            runner.close()

    def __init__(self, wd: WorkDir, progress: Progress | None = None, *, num_workers: int | None = None,
                 max_in_flight: int | None = None, max_retries: int = 3, inputs: dict[int, list[str]] | None = None):
        super().__init__(wd, progress, inputs)
        self.num_workers = num_workers or _cpu_count()
        self.max_in_flight, self.max_retries = max_in_flight, max_retries
        self._pool = None

    def _start(self):
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_init, initargs=(os.getpid(),))
        return self._pool

    def close(self) -> None:
        """Stop the (idle) workers; the next step would start a new pool."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _kill(self) -> None:
        """Kill the workers mid-task (their unfinished tasks have no marker: a rerun redoes them)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if hasattr(pool, "kill_workers"):  # Python 3.14
            pool.kill_workers()
        else:  # before any shutdown: shutdown forgets the processes, and they would run their tasks to the end
            for p in list((getattr(pool, "_processes", None) or {}).values()):
                with contextlib.suppress(OSError, ValueError):
                    p.kill()
        pool.shutdown(wait=True, cancel_futures=True)  # the manager thread sees the pool broken and ends

    def _execute(self, step, todo, fn):
        from collections import deque
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        limit = self.max_in_flight or self.num_workers * 2
        batches = batches_of(todo, limit, self.wd)
        payload = _dumps(fn)
        lost = [0] * len(batches)  # per batch: attempts lost with a dead worker
        queue, pending = deque(range(len(batches))), {}
        try:
            while queue or pending:
                pool = self._start()
                while len(pending) < limit and queue:
                    try:
                        f = pool.submit(_local_batch, payload, batches[queue[0]], self.wd, step)
                    except BrokenProcessPool:  # a worker died while idle (between steps): nothing lost
                        self.close()
                        pool = self._start()
                        continue
                    pending[f] = queue.popleft()
                done, _ = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                if not done and self.progress is not None:
                    self.progress.tick(step)
                if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                    done, _ = wait(pending)  # a worker died: every batch in flight went with the pool
                    logger.info("%s: a worker died; a new pool runs the %d batches that were in flight again", step, len(done))
                    self.close()
                retry = []
                for f in sorted(done, key=pending.get):
                    i = pending.pop(f)
                    try:
                        out = f.result()
                    except BrokenProcessPool as e:
                        lost[i] += 1
                        if lost[i] > self.max_retries:
                            raise self._lost_error(step, batches[i], lost[i], self.max_retries, e) from None
                        retry.append(i)
                        continue
                    except TaskFailed:
                        raise
                    except Exception as e:  # noqa: BLE001 - e.g. a result or an argument that does not pickle
                        raise self.error(step, batches[i][0], f"{type(e).__name__}: {e}", None) from None
                    yield from zip(batches[i], out)
                queue.extendleft(reversed(retry))
        except BaseException:  # an item's error, Ctrl-C, the caller closing the generator
            self._kill()
            raise
