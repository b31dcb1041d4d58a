"""One training step: the batch to int64 inputs and labels on the device, forward and backward
over the micro-batches, the loss reduced over ranks and the gradient clipped. Nothing is read
back to the host here: the loss and the norm stay on the device until a train record."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .config import TrainConfig
from .errors import TrainingError
from .model import position_ids


def local_batch_sizes(cfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """(sequences per rank per step, micro-batches per step)."""
    B = cfg.data.global_batch
    if B % world_size:
        raise TrainingError(f"data.global_batch={B} does not divide by the world size {world_size}")
    local = B // world_size
    micro = cfg.data.micro_batch or local
    if local % micro:
        raise TrainingError(f"data.micro_batch={micro} does not divide the per-rank batch {local} "
                            f"(global_batch {B} / world size {world_size})")
    return local, local // micro


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


# torch's uint16/uint32 have only limited eager support (on CUDA above all): their bytes travel as
# the signed type of the same width and are masked back to the unsigned value after widening.
_AS_SIGNED = {torch.uint16: (torch.int16, 0xFFFF), torch.uint32: (torch.int32, 0xFFFFFFFF)}


def inputs_and_labels(batch: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's int64 inputs and labels on ``device``. The loader hands over one (B, seq_len + 1)
    buffer in the shards' dtype (a quarter of int64's bytes over PCIe), widened and shifted here."""
    tokens = batch["tokens"]
    if tokens.dtype in _AS_SIGNED:
        signed, mask = _AS_SIGNED[tokens.dtype]
        tokens = tokens.view(signed).to(device, non_blocking=True).long() & mask
    else:
        tokens = tokens.to(device, non_blocking=True).long()
    return tokens[:, :-1], tokens[:, 1:]


def train_step(model, batch: dict, n_micro: int, grad_clip: float, device, *, step: int = 0,
               loss_hook: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over ``n_micro`` micro-batches, then clip. Returns the global mean loss
    and the global gradient norm as 0-d device tensors (no host sync); the caller decides whether
    to step. ``loss_hook(step, loss)`` may replace each micro-batch's loss before backward (Hooks.loss)."""
    inputs, labels = inputs_and_labels(batch, device)
    inputs, labels = inputs.chunk(n_micro), labels.chunk(n_micro)
    positions = position_ids(batch, device, n_micro)  # document mask: per-document rope and attention
    loss_sum = torch.zeros((), device=device)
    for i, (x, y, p) in enumerate(zip(inputs, labels, positions)):
        # Reduce-scatter gradients only after the last micro-batch; earlier ones accumulate locally.
        model.set_requires_gradient_sync(i == n_micro - 1)
        loss = cross_entropy(model(x, p), y) / n_micro
        if loss_hook is not None:
            loss = loss_hook(step, loss)
        loss.backward()
        loss_sum += loss.detach()
    # FSDP averages gradients over ranks; average the logged loss the same way.
    dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
    loss_sum /= dist.get_world_size()
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):  # a DTensor: the norm over every shard
        norm = norm.full_tensor()
    return loss_sum, norm
