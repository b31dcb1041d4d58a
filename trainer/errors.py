"""The trainer's errors, torch-free: ``trainer.meta`` (which the audit imports without torch) raises
them as well as ``trainer.checkpoint``, which re-exports them."""
from __future__ import annotations

from gristmill.errors import GristmillError


class CheckpointError(GristmillError):
    """A checkpoint cannot be used: names the directory or file and what is wrong with it."""
