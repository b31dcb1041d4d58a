"""The ``gristmill`` command: the application layer over the parts (pipeline, manifests, loader,
trainer, audit, report), one module per command. A command parses its arguments, calls a part's
library function and prints the result; the parts import neither argparse nor this package.
Heavy imports (Ray, torch) happen inside the handlers, so ``gristmill manifest show`` starts in a
blink."""
from __future__ import annotations

import argparse

from . import audit, demo_corpus, export, inspection, loader, manifest, mix, prepare, report, serve, takedown, train
from .common import run

# Each module has `register(subparsers)`; its handlers return an exit code. In `--help` order.
COMMANDS = (prepare, inspection, manifest, mix, export, loader, serve, train, audit, takedown, report, demo_corpus)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gristmill",
        description="Raw corpora -> content-hashed token shards -> deterministic loader -> FSDP2 trainer -> audit.",
        epilog="Docs: README.md and docs/ in the repository.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and full tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


__all__ = ["COMMANDS", "build_parser", "main"]
