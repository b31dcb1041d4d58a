"""The ``gristmill`` command. Each part registers its own subcommands; heavy imports (Ray,
torch) happen inside the handlers, so ``gristmill manifest show`` starts in a blink."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from gristmill.errors import GristmillError

# Each module has `register(subparsers)`; its handlers return an exit code.
COMMAND_MODULES = ("gristmill.manifests.cli", "gristmill.manifests.mix_cli", "gristmill.manifests.export_cli", "gristmill.pipeline.cli", "gristmill.pipeline.inspect",
                   "gristmill.loader.cli", "gristmill.trainer.cli", "gristmill.audit.cli", "gristmill.report.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gristmill",
        description="Raw corpora -> content-hashed token shards -> deterministic loader -> FSDP2 trainer -> audit.",
        epilog="Docs: README.md and docs/ in the repository.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and full tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    try:
        return int(args.handler(args) or 0)
    except GristmillError as e:
        # An error gristmill raised on purpose says what to do in one line; -v shows where.
        if args.verbose:
            traceback.print_exc()
        print(f"gristmill {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gristmill ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
