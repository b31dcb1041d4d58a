"""Progress of a step's tasks: tasks done / total, documents and MB per second, and an ETA.

On a terminal it is one line redrawn in place (a progress bar); otherwise (logs, CI, Ray job
logs) a plain line at most every ``interval`` seconds and one when the step ends, so a long
global step never sits silent on "running".
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


def _default_measure(stats: dict) -> tuple[int, int]:
    return int(stats.get("documents_in", 0)), int(stats.get("bytes_in", 0))


class Progress:
    def __init__(self, out: TextIO | None = None, *, quiet: bool = False, interval: float = 5.0, tty: bool | None = None):
        self.out = out or sys.stderr
        self.quiet, self.interval = quiet, interval
        self.tty = self.out.isatty() if tty is None else tty
        self._step = None

    def start(self, step: str, total: int, *, resumed: int = 0, measure: Callable | None = None) -> None:
        self._step, self.total, self.done, self.resumed = step, total, resumed, resumed
        self.measure = measure or _default_measure
        self.docs = self.bytes = 0
        self.t0 = self._last = time.perf_counter()
        if resumed:
            self._print(f"[{step}] {resumed} of {total} tasks already done", final=True)

    def advance(self, step: str, stats: dict) -> None:
        self.done += 1
        d, b = self.measure(stats)
        self.docs, self.bytes = self.docs + d, self.bytes + b
        self.tick(step)

    def tick(self, step: str) -> None:
        now = time.perf_counter()
        if self.tty or now - self._last >= self.interval:
            self._last = now
            self._print(self.line())

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        ran = self.done - self.resumed
        left = self.total - self.done
        eta = f"  ETA {elapsed / ran * left:,.0f}s" if ran and left else ""
        width = 20
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        rate = f"  {self.docs / elapsed:,.0f} docs/s  {self.bytes / 1e6 / elapsed:,.1f} MB/s" if self.docs or self.bytes else ""
        return f"[{self._step}] [{bar}] {self.done}/{self.total} tasks  {elapsed:,.1f}s{rate}{eta}"

    def finish(self, step: str) -> None:
        if self.done > self.resumed or not self.resumed:
            self._print(self.line(), final=True)

    def _print(self, text: str, final: bool = False) -> None:
        if self.quiet:
            return
        if self.tty:
            self.out.write("\r\033[K" + text + ("\n" if final else ""))
        else:
            self.out.write(text + "\n")
        self.out.flush()
