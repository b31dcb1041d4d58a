"""``gristmill train JOB.yaml``. Several processes: run it under torchrun, e.g.
``torchrun --nproc_per_node 8 -m gristmill train configs/train-1b.yaml``
(or ``torchrun --nproc_per_node 8 -m gristmill.trainer configs/train-1b.yaml``, the same command)."""
from __future__ import annotations

import argparse
import sys

from .common import add_job_arguments, load_job, run


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_job_arguments(p, "train job YAML (see configs/)")
    p.add_argument("--stop-after-step", type=int, help="checkpoint and exit after this step (a time-sliced job)")
    p.add_argument("--allow-manifest-change", action="store_true",
                   help="resume a checkpoint onto a data manifest with a different hash (recorded in meta.json)")


def register(sub) -> None:
    p = sub.add_parser("train", help="pretrain a decoder-only model on a published manifest (FSDP2, under torchrun)")
    add_arguments(p)
    p.set_defaults(handler=_train)


def _train(args, hooks=None) -> int:
    """Train; 0 when done, 128 + signal number when SIGINT/SIGTERM stopped it (the message says
    which checkpoint to resume from). ``--print-config`` prints before torch is imported."""
    from gristmill.trainer.config import load

    cfg = load_job(args, load)
    if cfg is None:
        return 0
    import logging

    import torch.distributed as dist

    from gristmill.trainer.errors import Interrupted
    from gristmill.trainer.train import train

    logging.getLogger("gristmill.trainer").setLevel(logging.INFO)
    together = False  # every rank ended the run after the same step: they may wait for each other to leave
    try:
        train(cfg, stop_after_step=args.stop_after_step, allow_manifest_change=args.allow_manifest_change, hooks=hooks)
        together = True
    except Interrupted as e:  # the stop was agreed in a train record's gather: every rank raises it at that step
        together = True
        print(f"gristmill train: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        if dist.is_initialized():
            leave(dist, together)
    return 0


def leave(dist, together: bool) -> None:
    """End the process group; after a run every rank ended at the same step, all ranks at once (a barrier
    first). destroy_process_group does not stop gloo's threads here: torch's own caches keep the trainer's
    device mesh, and so the backend, alive, and its worker and socket threads live on into the
    interpreter's shutdown. A rank that exits while its peer is still inside gloo tears those down under
    it, which aborted the rank probes of tests/test_trainer_init.py now and then ("terminate called
    without an active exception") until they left together (issue 40). After an error a peer may be
    gone or stuck: no barrier then, the group is only destroyed."""
    if together and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None, hooks=None) -> int:
    """``gristmill train`` alone (``python -m gristmill.trainer``; tests/fault_launcher.py passes
    ``hooks``, a ``trainer.hooks.Hooks``, to inject faults)."""
    p = argparse.ArgumentParser(prog="gristmill train", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    args.command = "train"
    return run(args, lambda a: _train(a, hooks))
