"""Who runs a prepare's tasks: the registry of runners, by ``kind`` (the job's ``runner.kind``).

A runner is a ``pipeline.runner.Runner`` subclass that declares its ``kind``, the ``runner:`` keys
it reads (``options``), whether it retries a batch whose worker died (``retries_lost_workers``),
and owns its start-up and shutdown (``start``). ``auto`` (the default) is no runner of its own:
``resolve`` makes it ``ray`` when a Ray cluster is named (``--address``, ``runner.address`` or
RAY_ADDRESS, which ``ray job submit`` sets), else ``local``. A new runner: one module here with
its class, and its entry in ``RUNNERS``; tests/test_runner_conformance.py runs every entry.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from gristmill.errors import ConfigError

from ..progress import Progress
from ..runner import Runner, SerialRunner
from ..workdir import WorkDir
from .local import LocalRunner
from .ray import RayRunner

RUNNERS: dict[str, type[Runner]] = {cls.kind: cls for cls in (SerialRunner, LocalRunner, RayRunner)}
KINDS = ("auto", *RUNNERS)  # runner.kind's choices
AUTO_OPTIONS = tuple(dict.fromkeys(o for k in ("local", "ray") for o in RUNNERS[k].options))


def resolve(cfg, address: str | None = None):
    """The ``runner:`` section ``cfg`` with ``auto`` resolved, ``--address`` (``address``) applied:
    it overrides ``runner.address`` and asks for a Ray runner."""
    join = address or cfg.address or os.environ.get("RAY_ADDRESS")
    if join and not {"address"} <= set(RUNNERS.get(cfg.kind, RayRunner).options):
        named = f"--address {address}" if address else (f"runner.address: {cfg.address}" if cfg.address
                                                         else f"RAY_ADDRESS={join}")
        raise ConfigError(f"runner.kind: {cfg.kind} runs on this machine only, but a Ray cluster is named ({named}); "
                          "set runner.kind: auto (or ray) to run on the cluster, or drop the address")
    kind = ("ray" if join else "local") if cfg.kind == "auto" else cfg.kind
    return cfg.model_copy(update={"kind": kind, "address": address or cfg.address})


@contextlib.contextmanager
def start(cfg, wd: WorkDir, progress: Progress | None = None, inputs: dict[int, list[str]] | None = None,
          address: str | None = None) -> Iterator[Runner]:
    """The job's runner (``resolve``), started, and stopped with its workers (or its Ray) at the end."""
    cfg = resolve(cfg, address)
    with RUNNERS[cfg.kind].start(cfg, wd, progress, inputs) as runner:
        yield runner
