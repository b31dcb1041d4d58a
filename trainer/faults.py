"""Fault injection for the trainer's own tests: ``GRISTMILL_FAULTS="nan_loss@3,hang_before_commit@4"``.

Each entry is ``<fault>@<step>``. Unset (the normal case) means no fault and no cost. The tests
use it to prove that a non-finite loss is skipped and that a ``kill -9`` while a checkpoint is
being committed leaves the previous checkpoint in charge.
"""
from __future__ import annotations

import os
import time

KNOWN = ("nan_loss", "hang_before_commit")


def _active() -> set[tuple[str, int]]:
    spec = os.environ.get("GRISTMILL_FAULTS", "")
    out = set()
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, step = item.partition("@")
        if name not in KNOWN or not step.isdigit():
            raise ValueError(f"GRISTMILL_FAULTS: bad entry {item!r}; expected <fault>@<step> with fault in {KNOWN}")
        out.add((name, int(step)))
    return out


def enabled(name: str, step: int) -> bool:
    return (name, step) in _active()


def maybe_hang(name: str, step: int, where: str) -> None:
    """Announce the hang with a marker file in the run directory (``where`` is a checkpoint temp
    directory under <run_dir>/checkpoints/), then block until killed."""
    if not enabled(name, step):
        return
    run_dir = os.path.dirname(os.path.dirname(where))
    with open(os.path.join(run_dir, f"HANGING-{name}-{step}"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(60)
