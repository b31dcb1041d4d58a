"""Stopping between two steps on SIGINT / SIGTERM, every rank after the same step."""
from __future__ import annotations

import logging
import signal
import threading
import time

log = logging.getLogger("gristmill.trainer")


class StopSignals:
    """While active, SIGINT and SIGTERM (what schedulers send) only set ``signum``: the loop stops
    at the end of the step, after committing a checkpoint being written, instead of a
    KeyboardInterrupt tearing through collectives, loader threads and a half-written save. A
    second signal interrupts at once, except a repeat of the first within ``REPEAT_S``: a Ctrl-C
    under torchrun reaches each worker twice, from the terminal and forwarded by torchrun."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    REPEAT_S = 2.0

    def __init__(self):
        self.signum = 0
        self._first_at = 0.0
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signum:
            if signum == self.signum and time.monotonic() - self._first_at < self.REPEAT_S:
                return
            raise KeyboardInterrupt
        self.signum, self._first_at = signum, time.monotonic()
        log.warning("%s: stopping after this step (again to stop now)", signal.Signals(signum).name)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def agreed(self, windows: list[dict] | None) -> int:
        """The stop signal any rank got (0: none). Every rank must stop after the same step, or the
        others would wait forever in the next step's collectives. The signals travel in the
        gather of a train record (trainer/rank_stats.py: ``windows``, every rank's), so agreeing
        costs no collective or host sync of its own; a signal stops the run at the next record
        (``run.log_every``). ``None``: no record at this step (with one rank its own signal counts)."""
        if windows is None:
            return 0
        return int(max(w["signum"] for w in windows))
