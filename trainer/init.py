"""Initial weights that do not depend on the world size, drawn shard by shard.

A parameter of global shape (R, ...) is cut into fixed row blocks of about ``BLOCK_ELEMENTS``
elements, the cut depending on the shape alone. Block b is drawn from its own generator, seeded
from (seed, parameter name, b). A rank fills its shard (rows [r0, r1) of the global tensor, from
the DTensor's placement) by drawing only the blocks that overlap those rows and copying the
overlap. So:

- the full tensor is the same for every world size and every FSDP / HSDP layout (the blocks and
  their seeds are the same; only who draws them changes), which tests/test_trainer_init.py checks;
- no rank ever holds more than its shard plus one block (4 MiB in fp32) of a parameter, instead
  of a full copy (the 8b preset's embedding alone is 2.1 GB in fp32);
- blocks at shard edges are drawn by both neighbours: at most two extra blocks per parameter
  and rank, a negligible cost next to drawing the shard.

The generator lives on the parameter's device (a CUDA Philox generator on GPU), so a GPU draws its
shards at GPU speed; the values differ between a CPU and a GPU start of the same seed, never
between world sizes on one kind of device.
"""
from __future__ import annotations

import hashlib
import math

import torch

BLOCK_ELEMENTS = 1 << 20


def _block_seed(seed: int, name: str, block: int) -> int:
    digest = hashlib.sha256(f"{seed}\0{name}\0{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def local_rows(param: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the local tensor this rank holds, the global row of its first row). A plain tensor is its
    own shard at row 0; a DTensor may be sharded on dim 0 only (FSDP's layout)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param, 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = param.to_local()
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if tuple(shape[1:]) != tuple(param.shape[1:]) or any(offset[1:]):
        raise ValueError(f"deterministic init supports sharding on dim 0 only; got local shape {tuple(shape)} at "
                         f"offset {tuple(offset)} of {tuple(param.shape)}")
    return local, int(offset[0]) if len(offset) else 0


@torch.no_grad()
def normal_(param: torch.Tensor, name: str, *, seed: int, std: float) -> None:
    """Fill ``param`` (or this rank's shard of it) with N(0, std^2) values that depend only on
    (seed, name, the global shape)."""
    local, row0 = local_rows(param)
    if local.numel() == 0:
        return
    shape = tuple(param.shape)
    rows, row_elems = shape[0], math.prod(shape[1:])
    per_block = max(1, BLOCK_ELEMENTS // max(1, row_elems))
    lo, hi = row0, row0 + local.shape[0]
    gen = torch.Generator(device=local.device)
    for block in range(lo // per_block, (hi - 1) // per_block + 1):
        b0, b1 = block * per_block, min(rows, (block + 1) * per_block)
        gen.manual_seed(_block_seed(seed, name, block))
        values = torch.empty((b1 - b0,) + shape[1:], dtype=local.dtype, device=local.device)
        values.normal_(0.0, std, generator=gen)
        s0, s1 = max(lo, b0), min(hi, b1)
        local[s0 - lo:s1 - lo].copy_(values[s0 - b0:s1 - b0])


@torch.no_grad()
def ones_(param: torch.Tensor) -> None:
    local_rows(param)[0].fill_(1.0)


def canonical_name(name: str) -> str:
    """A parameter's name without the wrappers' module levels (activation checkpointing's
    ``_checkpoint_wrapped_module``, compile's ``_orig_mod``): the checkpoint's key, so the
    initial weights do not change when a wrapper is switched on."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
