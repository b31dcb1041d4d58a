"""What every command shares: the job-file options (``--set``, ``--print-config``, one
implementation for prepare, train and mix) and the error contract (a ``GristmillError`` is one
line and exit 2; its traceback too under ``-v``; anything else is a bug and keeps its traceback)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from gristmill import config
from gristmill.errors import GristmillError


def add_job_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """The job file and its ``--set`` / ``--print-config``, the same on every command that reads one."""
    p.add_argument("job", help=what)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job field (VALUE is YAML), e.g. --set run.steps=10 or --set inputs[0].format=jsonl; repeatable")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved job (every default, overrides applied, paths absolute) as YAML and exit")


def load_job(args: argparse.Namespace, load: Callable[[str, list[str]], Any]) -> Any | None:
    """The job ``load(path, overrides)`` reads, or None once ``--print-config`` printed it (the
    command then exits 0 before anything runs)."""
    job = load(args.job, args.overrides)
    if args.print_config:
        print(config.dump_yaml(job), end="")
        return None
    return job


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def run(args: argparse.Namespace, handler: Callable[[argparse.Namespace], int | None] | None = None) -> int:
    """Call the command's handler (``args.handler`` unless given) under the error contract."""
    setup_logging(getattr(args, "verbose", False))
    try:
        return int((handler or args.handler)(args) or 0)
    except GristmillError as e:
        # An error gristmill raised on purpose says what to do in one line; -v shows where.
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"gristmill {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gristmill ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
