"""The trainer's errors, torch-free (``trainer.meta``, which the audit imports without torch, raises
``CheckpointError`` as well as ``trainer.checkpoint``, which re-exports it): ``CheckpointError`` and
``TrainingError`` (the run cannot continue) with its family."""
from __future__ import annotations

import signal

from gristmill.errors import GristmillError


class TrainingError(GristmillError):
    """The run cannot continue: the message says why and what to do."""


class ManifestMismatchError(TrainingError):
    """A checkpoint was trained on a different data manifest than the job names."""


class Interrupted(TrainingError):
    """SIGINT or SIGTERM stopped the run between two steps; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int, step: int, latest: str | None):
        self.exit_code = 128 + signum
        where = f"the newest checkpoint is {latest}" if latest else "no checkpoint was written yet"
        super().__init__(f"{signal.Signals(signum).name} after step {step}: stopped; {where} "
                         f"(run the same command to resume)")


class CheckpointError(GristmillError):
    """A checkpoint cannot be used: names the directory or file and what is wrong with it."""
