"""The optimizer: AdamW with weight decay on matrices only (the schedule: trainer/state.py's WarmupCosine)."""
from __future__ import annotations

import torch

from .config import OptimizerConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig, device: torch.device) -> torch.optim.AdamW:
    # Weight decay on matrices only; norm gains are scale parameters that decay would shrink to 0.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # Fused (CUDA and CPU): one kernel for all parameters instead of a few per tensor, and the only
    # implementation that takes ``found_inf``: a bad step is skipped inside the kernel, decided on
    # the device, so no step waits for the host to read the loss (trainer/train.py optimizer_step).
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=True)
