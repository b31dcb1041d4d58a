"""``python tests/fault_launcher.py [--fault NAME@STEP ...] JOB.yaml [trainer args]``: the trainer's
main with faults injected through its hooks (trainer.hooks.Hooks), for subprocess tests.

Faults: ``nan_loss@N`` makes step N's loss NaN (the step must be skipped); ``hang_before_commit@N``
blocks the step-N save after meta.json is written and before the rename that commits it, after
writing the marker file ``<run_dir>/HANGING-hang_before_commit-N`` (the test then kill -9s it);
``stall_upload@N`` stalls the step-N upload of the last rank (``$WORLD_SIZE - 1``) before its first file,
after writing ``<run_dir>/HANGING-stall_upload-N``: training goes on, the step is never committed;
``slow_upload@N`` delays it by ``SLOW_UPLOAD_S`` instead: the step is committed late.
Markers assume the default ``checkpoint.local_dir`` (``<run_dir>/checkpoints``).

Under torchrun, faults of one rank (rank 1), in the first round only (TORCHELASTIC_RESTART_COUNT 0,
so the restarted job runs clean): ``hang@N`` blocks rank 1 before step N's backward, so rank 0
blocks inside that step's collectives (the watchdog must end both); ``pid@N`` writes rank 1's pid
to ``<marker dir>/pid-rank1`` at step N (the test kill -9s it). ``slow_data@MS`` makes rank 1 sleep
MS milliseconds in its data path every step, every round (a straggler).

``--count-collectives``: every rank writes ``<marker dir>/counts-rank<R>.jsonl``, one line per step
with the number of calls to each torch.distributed collective and to host reads of a tensor
(``Tensor.item``, ``tolist``) made from that step's data hook to the next step's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gristmill.cli.train import main
from gristmill.trainer.hooks import Hooks

FAULTS = ("nan_loss", "hang_before_commit", "hang", "pid", "slow_data", "stall_upload", "slow_upload")
SLOW_UPLOAD_S = 5.0
COUNTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier",
           "all_gather_object", "reduce_scatter", "all_to_all_single")


def parse(specs: list[str]) -> dict[str, set[int]]:
    out = {name: set() for name in FAULTS}
    for spec in specs:
        name, _, step = spec.partition("@")
        if name not in FAULTS or not step.isdigit():
            raise SystemExit(f"--fault {spec!r}: expected NAME@STEP with NAME in {', '.join(FAULTS)}")
        out[name].add(int(step))
    return out


def first_round_rank1() -> bool:
    return os.environ.get("RANK") == "1" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def hooks(faults: dict[str, set[int]], marker_dir: str, counter=None) -> Hooks:
    rank = int(os.environ.get("RANK", "0"))

    def loss(step, value):
        if step in faults["hang"] and first_round_rank1():
            while True:
                time.sleep(60)
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
        if rank == int(os.environ.get("WORLD_SIZE", 1)) - 1:
            if step in faults["stall_upload"]:
                hang("stall_upload", step, local_dir)
            if step in faults["slow_upload"]:
                time.sleep(SLOW_UPLOAD_S)

    def data(step):
        if counter is not None:
            counter.step(step)
        if step in faults["pid"] and first_round_rank1():
            with open(os.path.join(marker_dir, "pid-rank1"), "w") as f:
                f.write(str(os.getpid()))
        if faults["slow_data"] and rank == 1:
            time.sleep(max(faults["slow_data"]) / 1000)

    return Hooks(loss=loss, before_commit=before_commit, upload=upload, data=data)


class Counter:
    """Counts calls to torch.distributed's collectives and to Tensor.item/tolist, per step."""

    def __init__(self, path: str):
        import torch
        import torch.distributed as dist

        self.path, self.counts, self.current = path, {}, None
        for name in COUNTED:
            setattr(dist, name, self._wrap(getattr(dist, name), name))
        for name in ("item", "tolist"):
            setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name), name))

    def _wrap(self, fn, name):
        def counted(*args, **kwargs):
            self.counts[name] = self.counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return counted

    def step(self, step: int) -> None:
        if self.current is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": self.current, "counts": self.counts}) + "\n")
        self.current, self.counts = step, {}


if __name__ == "__main__":
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--fault", action="append", default=[])
    p.add_argument("--marker-dir", default=".")
    p.add_argument("--count-collectives", action="store_true")
    known, rest = p.parse_known_args()
    counter = None
    if known.count_collectives:
        counter = Counter(os.path.join(known.marker_dir, f"counts-rank{os.environ.get('RANK', '0')}.jsonl"))
    sys.exit(main(rest, hooks=hooks(parse(known.fault), known.marker_dir, counter)))
