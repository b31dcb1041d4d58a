"""The ``gristmill`` command. Each part registers its own subcommands; heavy imports (Ray,
torch) happen inside the handlers, so ``gristmill manifest show`` starts in a blink."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# Each module has `register(subparsers)`; its handlers return an exit code.
COMMAND_MODULES = ("manifests.cli", "pipeline.cli", "loader.cli", "trainer.cli", "audit.cli")


class UsageError(Exception):
    """A user-facing error: printed as one line, exit code 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gristmill",
        description="Raw corpora -> content-hashed token shards -> deterministic loader -> FSDP2 trainer -> audit.",
        epilog="Docs: README.md and docs/ in the repository.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    from manifests.errors import ManifestError

    try:
        return int(args.handler(args) or 0)
    except (UsageError, ManifestError, FileNotFoundError) as e:
        print(f"gristmill {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gristmill ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy, so `except UsageError` catches the
    # class the handlers raise.
    from gristmill.cli import main as _main

    sys.exit(_main())
