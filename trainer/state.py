"""What a checkpoint holds, as DCP ``Stateful`` objects (torchtitan's pattern): the model, the
optimizer, the LR schedule, the loader and the train state each save and restore themselves, and
``Checkpointer`` hands DCP one dict of them. DCP calls ``state_dict()`` on save, and on load fills
that same structure from the files, then calls ``load_state_dict()`` with it.

Non-tensor values (ints, strings) travel as DCP byte entries and are read back through the
restricted unpickler (trainer.checkpoint.SafeLoadPlanner). Every rank saves the same values for
them (DCP writes one copy), so nothing rank-local belongs here: per-rank RNG states are in meta.json.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from . import config as config_mod


class ModelState(Stateful):
    """The sharded model: DTensor shards, resharded by DCP when the world size changes."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        return get_model_state_dict(self.model)

    def load_state_dict(self, sd: dict) -> None:
        set_model_state_dict(self.model, sd)


class OptimizerState(Stateful):
    """AdamW's moments and step counts, keyed by parameter name (not by position)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, sd: dict) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, sd)


def lr_at(step: int, cfg: config_mod.OptimizerConfig, total_steps: int) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine down to ``lr * min_lr_ratio``."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class WarmupCosine(Stateful):
    """The LR schedule: a pure function of the optimizer step (:func:`lr_at`), so its state is the
    step it has reached. ``step(n)`` sets optimizer step ``n``'s LR on every parameter group."""

    KIND = "warmup_cosine"

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: config_mod.OptimizerConfig, total_steps: int):
        self.optimizer, self.cfg, self.total_steps = optimizer, cfg, total_steps
        self.last_step = 0

    def step(self, step: int) -> float:
        lr = lr_at(step, self.cfg, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.last_step = step
        return lr

    def describe(self) -> dict:
        """meta.json's ``scheduler`` record."""
        return {"kind": self.KIND, "step": self.last_step, "lr": self.cfg.lr, "warmup_steps": self.cfg.warmup_steps,
                "total_steps": self.total_steps, "min_lr_ratio": self.cfg.min_lr_ratio,
                "last_lr": lr_at(max(self.last_step, 1), self.cfg, self.total_steps)}

    def state_dict(self) -> dict:
        return {"kind": self.KIND, "last_step": self.last_step}

    def load_state_dict(self, sd: dict) -> None:
        self.last_step = int(sd["last_step"])


class LoaderState(Stateful):
    """The loader's position. ``manifest_sha256``, when set, replaces the saved manifest hash on
    load: a resume onto a different manifest that the user explicitly allowed (trainer.resume.check_resume)."""

    def __init__(self, loader, manifest_sha256: str | None = None):
        self.loader, self.manifest_sha256 = loader, manifest_sha256
        self.loaded: dict | None = None  # the state as read from the checkpoint, for the meta.json cross-check

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.loaded = dict(sd)
        if self.manifest_sha256 is not None:
            sd = {**sd, "manifest_sha256": self.manifest_sha256}
        self.loader.load_state_dict(sd)


@dataclass
class TrainState(Stateful):
    """Counters of the run: optimizer steps done, tokens consumed, non-finite steps skipped."""

    step: int = 0
    tokens_seen: int = 0
    skipped_total: int = 0
    consecutive_bad: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, sd: dict) -> None:
        for key in asdict(self):
            setattr(self, key, int(sd[key]))
