"""``python tests/fault_launcher.py [--fault NAME@STEP ...] JOB.yaml [trainer args]``: the trainer's
main with faults injected through its hooks (trainer.hooks.Hooks), for subprocess tests.

Faults: ``nan_loss@N`` makes step N's loss NaN (the step must be skipped); ``hang_before_commit@N``
blocks the step-N save after meta.json is written and before the rename that commits it, after
writing the marker file ``<run_dir>/HANGING-hang_before_commit-N`` (the test then kill -9s it);
``stall_upload@N`` stalls the step-N upload of the last rank (``$WORLD_SIZE - 1``) before its first file,
after writing ``<run_dir>/HANGING-stall_upload-N``: training goes on, the step is never committed.
Markers assume the default ``checkpoint.local_dir`` (``<run_dir>/checkpoints``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from gristmill.cli.train import main
from gristmill.trainer.hooks import Hooks

FAULTS = ("nan_loss", "hang_before_commit", "stall_upload")


def parse(specs: list[str]) -> dict[str, set[int]]:
    out = {name: set() for name in FAULTS}
    for spec in specs:
        name, _, step = spec.partition("@")
        if name not in FAULTS or not step.isdigit():
            raise SystemExit(f"--fault {spec!r}: expected NAME@STEP with NAME in {', '.join(FAULTS)}")
        out[name].add(int(step))
    return out


def hooks(faults: dict[str, set[int]]) -> Hooks:
    def loss(step, value):
        return value * float("nan") if step in faults["nan_loss"] else value

    def hang(name, step, local_dir):
        run_dir = os.path.dirname(os.path.dirname(local_dir))  # <run_dir>/checkpoints/step-N
        with open(os.path.join(run_dir, f"HANGING-{name}-{step}"), "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(60)

    def before_commit(step, local_dir):
        if step in faults["hang_before_commit"]:
            hang("hang_before_commit", step, local_dir)

    def upload(step, rank, rel, local_dir):
        if step in faults["stall_upload"] and rank == int(os.environ.get("WORLD_SIZE", 1)) - 1:
            hang("stall_upload", step, local_dir)

    return Hooks(loss=loss, before_commit=before_commit, upload=upload)


if __name__ == "__main__":
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--fault", action="append", default=[])
    known, rest = p.parse_known_args()
    sys.exit(main(rest, hooks=hooks(parse(known.fault))))
