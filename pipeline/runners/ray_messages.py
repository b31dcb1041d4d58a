"""Ray's own messages to the driver, kept off the user's terminal: each whole in the run dir's log
(``logs/ray/driver.log``), and one line of gristmill's in its place.

Ray pushes some events to every driver whatever ``log_to_driver`` says (that switch, off in every
Ray gristmill starts or joins, covers only the workers' own output): a node whose raylet died
("Raylet is terminated ... Last 20 lines of the Raylet logs", ~22 lines, once for each of the
node's agents that saw it), a task retried after its node was lost, a worker the OOM killer took.
The driver's thread ``listen_error_messages`` prints them through
``ray._private.worker.print_to_stdstream``, and Ray (2.60) has no setting to turn that off or send
it elsewhere: a lost node poured ~45 lines of raylet log into the terminal of a prepare that went
on to succeed. So while a runner runs, ``driver_messages_to_log`` puts its own function there:
a message goes whole to the log, and its first two sentences, once per distinct message, to
gristmill's log as one WARNING line naming the file. What is not a message of Ray's (a worker's
output, were ``log_to_driver`` on) goes to Ray's printer as before; so does a message the log
cannot take (a full disk): nothing is lost.
"""
from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from typing import Iterator

from ..workdir import WorkDir

logger = logging.getLogger("gristmill.pipeline.runners.ray")
_SENTENCES = re.compile(r"^(.*?[.!?])(\s+.*?[.!?])?(\s|$)")


class DriverMessages:
    """The replacement of Ray's printer: Ray's messages (``pid`` "raylet") appended to the run dir's
    log, rewritten whole on each (an object store has no append; there are a handful per run)."""

    def __init__(self, wd: WorkDir, ray_print):
        self.wd, self.ray_print = wd, ray_print
        self.path = wd.log("ray", "driver")
        self.text: list[str] = []
        self.shown: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, data: dict, ignore_prefix: bool = False) -> None:
        if data.get("pid") != "raylet":
            self.ray_print(data, ignore_prefix)
            return
        lines = [str(line) for line in data.get("lines", [])]
        with self.lock:
            self.text += [f"{time.strftime('%Y-%m-%d %H:%M:%S')} (raylet) {line}" for line in lines]
            try:
                self.wd.write(self.path, "\n".join(self.text + [""]).encode("utf-8", "backslashreplace"))
            except Exception:  # noqa: BLE001 - a full disk, an object store gone: this runs in Ray's listener
                self.ray_print(data, ignore_prefix)  # thread, which one raise would end; Ray's own way, never lost
                return
            for line in lines:
                head = summary(line)
                if head not in self.shown:
                    self.shown.add(head)
                    logger.warning("Ray: %s (Ray's whole message: %s)", head, self.path)


def summary(message: str) -> str:
    """The first two sentences of a message's first line (at most 200 characters)."""
    first = message.strip().split("\n", 1)[0]
    m = _SENTENCES.match(first)
    head = (m.group(1) + (m.group(2) or "")) if m else first
    return head if len(head) <= 200 else head[:199] + "…"


@contextlib.contextmanager
def driver_messages_to_log(wd: WorkDir) -> Iterator[DriverMessages | None]:
    """Ray's messages to this driver into ``wd``'s log while the block runs (``DriverMessages``); Ray's
    printer is put back at the end. A Ray without that printer (a later version) is left as it is."""
    import ray._private.worker as ray_worker

    ray_print = getattr(ray_worker, "print_to_stdstream", None)
    if ray_print is None:
        logger.debug("this Ray has no print_to_stdstream: its messages to the driver are printed as Ray prints them")
        yield None
        return
    messages = DriverMessages(wd, ray_print)
    ray_worker.print_to_stdstream = messages
    try:
        yield messages
    finally:
        ray_worker.print_to_stdstream = ray_print
