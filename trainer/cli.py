"""``gristmill train JOB.yaml``. Several processes: run it under torchrun, e.g.
``torchrun --nproc_per_node 8 $(which gristmill) train configs/train-1b.yaml``
(or ``torchrun --nproc_per_node 8 -m gristmill.trainer configs/train-1b.yaml``)."""
from __future__ import annotations

import argparse

from gristmill import config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="train job YAML (see configs/)")
    config.add_arguments(p)
    p.add_argument("--stop-after-step", type=int, help="checkpoint and exit after this step (a time-sliced job)")
    p.add_argument("--allow-manifest-change", action="store_true",
                   help="resume a checkpoint onto a data manifest with a different hash (recorded in meta.json)")


def register(sub) -> None:
    p = sub.add_parser("train", help="pretrain a decoder-only model on a published manifest (FSDP2, under torchrun)")
    add_arguments(p)
    p.set_defaults(handler=_train)


def print_config(args) -> int:
    """``--print-config``: the resolved job as YAML, before torch is imported or anything runs."""
    from .config import load

    print(config.dump_yaml(load(args.job, args.overrides)), end="")
    return 0


def _train(args) -> int:
    if args.print_config:
        return print_config(args)
    import logging

    from .train import run

    logging.getLogger("gristmill.trainer").setLevel(logging.INFO)
    return run(args)
