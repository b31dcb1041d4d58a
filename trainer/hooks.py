"""Optional callbacks into a run (none by default). The tests inject faults through them."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Hooks:
    loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None  # (step, micro-batch loss) -> loss to backpropagate
    before_commit: Callable[[int, str], None] | None = None  # (step, local dir) on rank 0 before a save's meta.json is created
    upload: Callable[[int, int, str, str], None] | None = None  # (step, rank, file, local dir) before each file's upload
    data: Callable[[int], None] | None = None  # (step) in the data path, before the step's batch is taken
