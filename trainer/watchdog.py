"""A per-rank watchdog: a step (or save, evaluation, resume) that runs past ``run.hang_timeout_s``
dumps every thread's stack, names the step, the rank and the host, and ends the process with
``EXIT_CODE``. A hung collective otherwise blocks for as long as the process-group timeout, or
forever when a peer is alive but stuck; an exit lets ``torchrun --max-restarts N`` (or the
Kubernetes Job, or Slurm's requeue) restart the job from the newest valid checkpoint.

Arming costs two attribute writes per step: no lock, no thread started, no host sync. A Python
thread checks the deadline; it needs the GIL, so a hang inside C code that holds the GIL would
silence it. For that case faulthandler's own C thread, re-armed by the Python thread while it
runs, dumps the stacks (its header: ``Timeout (H:MM:SS)!``) and exits a little later.
"""
from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time

EXIT_CODE = 75  # distinct from errors (1, 2) and signals (128+N): "hung, restart me"
BACKSTOP_S = 30.0  # the GIL-free dump fires this much after the watchdog's own deadline
GROUP_MARGIN_S = 5.0  # the process group's timeout is this much longer, so the watchdog speaks first


def group_timeout_s(hang_timeout_s: float) -> float:
    """The process-group timeout for ``run.hang_timeout_s`` (0: torch's default). A little longer
    than the watchdog's, so a hung collective is reported by the watchdog (step, rank, host and
    every thread's stack) rather than by gloo's or NCCL's own timeout; theirs remains the backstop."""
    return hang_timeout_s + GROUP_MARGIN_S if hang_timeout_s > 0 else 0.0


class Watchdog:
    """``arm(step, what)`` before a phase that may block on other ranks, ``disarm()`` after it.
    ``timeout_s`` 0 disables it. ``on_expiry`` (tests) replaces the exit."""

    def __init__(self, timeout_s: float, rank: int, *, on_expiry=None):
        self.timeout_s, self.rank, self.host = timeout_s, rank, socket.gethostname()
        self.on_expiry = on_expiry or _exit
        self._deadline: float | None = None
        self._what = ""
        self._stop = threading.Event()
        self._thread = None
        if timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, name="gristmill-watchdog", daemon=True)
            self._thread.start()

    def arm(self, step: int, what: str) -> None:
        # the label first: the thread reads the deadline, then the label
        self._what = f"{what} (step {step})"
        self._deadline = time.monotonic() + self.timeout_s

    def disarm(self) -> None:
        self._deadline = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            faulthandler.cancel_dump_traceback_later()

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _watch(self) -> None:
        tick = min(1.0, max(0.05, self.timeout_s / 10))
        backstop = False
        while not self._stop.wait(tick):
            deadline = self._deadline
            if deadline is None:
                if backstop:
                    faulthandler.cancel_dump_traceback_later()
                    backstop = False
                continue
            if time.monotonic() < deadline:
                faulthandler.dump_traceback_later(self.timeout_s + BACKSTOP_S, exit=True)
                backstop = True
                continue
            what = self._what
            message = (f"gristmill watchdog: rank {self.rank} on host {self.host} (pid {os.getpid()}): "
                       f"{what} still running after run.hang_timeout_s={self.timeout_s:g}; "
                       f"stacks of every thread follow; exiting with code {EXIT_CODE} so the launcher "
                       f"restarts the job from the newest checkpoint")
            print(message, file=sys.stderr, flush=True)  # not through logging: its handlers may be what hangs
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            self.on_expiry(what)
            return


def _exit(what: str) -> None:
    sys.stderr.flush()
    os._exit(EXIT_CODE)  # no cleanup: the main thread is stuck, and atexit handlers could block too
