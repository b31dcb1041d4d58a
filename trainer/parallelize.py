"""Small composable functions that turn a plain model into a distributed one, torchtitan-style:
init the process group, build the device mesh, then apply activation checkpointing, compile
and FSDP2 in that order (each wraps what the previous produced).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.constants import default_pg_timeout

from gristmill.errors import UsageError

from .rendezvous import agent_store, round_store, uses_agent_store


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def init_distributed(timeout_s: float = 0) -> Dist:
    """Join the torchrun process group (NCCL on GPU, gloo on CPU) from torchrun's environment
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT). A plain ``python`` start (no RANK) is a group
    of one over an in-process store, so the same FSDP and DCP code paths run in every test.
    Under torchrun's agent-hosted store the group's keys live in a namespace of this restart round
    (trainer/rendezvous.py: torch reuses that store across rounds without one). ``timeout_s``
    (run.hang_timeout_s; 0: torch's default) bounds the rendezvous and every collective.
    ``os.environ`` is only read, never written: a library must not change its caller's environment."""
    single = "RANK" not in os.environ
    local_rank = 0 if single else int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        timeout = {"timeout": timedelta(seconds=timeout_s)} if timeout_s > 0 else {}
        if single:
            explicit = {"rank": 0, "world_size": 1, "store": dist.HashStore()}
        elif uses_agent_store():
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            wait = timedelta(seconds=timeout_s) if timeout_s > 0 else default_pg_timeout
            explicit = {"rank": rank, "world_size": world_size,
                        "store": round_store(agent_store(wait), rank, world_size, wait)}
        else:
            explicit = {}
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None,
                                **explicit, **timeout)
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, device)


def build_mesh(device: torch.device, world_size: int, dp_shard: int = -1) -> DeviceMesh:
    """A 1-D FSDP mesh, or 2-D (replicate, shard) for HSDP when ``dp_shard`` < world size.

    The device type is passed explicitly: with a gloo group on a machine that has CUDA, letting
    torch guess would build a CUDA mesh over a CPU group (pytorch #132471).
    """
    shard = world_size if dp_shard in (-1, 0) else dp_shard
    if world_size % shard:
        raise UsageError(f"parallelism.dp_shard={dp_shard} does not divide the world size {world_size}")
    if shard == world_size:
        return init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(device.type, (world_size // shard, shard), mesh_dim_names=("dp_replicate", "dp_shard"))


def resolve_mixed_precision(mode: str, device: torch.device) -> torch.dtype:
    """The compute (parameter) dtype: bf16 on GPU by default, fp32 on CPU (exact tests)."""
    if mode == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[mode]


def resolve_attention(mode: str, device: torch.device) -> str:
    """``flash`` when asked for or (auto) when flash-attn is installed on GPU; else ``sdpa``."""
    from .model import _flash_attn

    if mode == "flash":
        if device.type != "cuda" or _flash_attn() is None:
            raise UsageError("parallelism.attention=flash needs a CUDA device and the flash-attn package "
                             "(pip install flash-attn); use auto or sdpa")
        return "flash"
    if mode == "auto" and device.type == "cuda" and _flash_attn() is not None:
        return "flash"
    return "sdpa"


# Selective activation checkpointing keeps the outputs of the expensive ops (matmuls, attention)
# and recomputes the cheap elementwise ones (norms, rotary, SiLU) in backward.
_SAVE_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
for _name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention"):
    if hasattr(torch.ops.aten, _name):
        _SAVE_OPS.add(getattr(torch.ops.aten, _name).default)


def _selective_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """none | selective (recompute elementwise ops) | full (recompute each block)."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    kwargs = {"preserve_rng_state": False}  # the model has no dropout: nothing random to replay
    if mode == "selective":
        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _selective_policy)
    elif mode != "full":
        raise UsageError(f"parallelism.activation_checkpoint: expected none, selective or full, got {mode!r}")
    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(block, **kwargs)


def apply_compile(model: nn.Module) -> None:
    """Compile each block in place (``Module.compile`` keeps parameter names, so checkpoints do not
    change); blocks share one compiled graph because they are identical."""
    for block in model.layers.values():
        block.compile()


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype) -> None:
    """FSDP units as torchtitan cuts them: the token embeddings, each block, the final norm and
    output head together, then the root (which then owns no parameters of its own). The
    embeddings and the head are the largest tensors at big vocabularies (the 8b preset's are
    525M parameters each): as units of their own they are gathered only around their own use,
    not for the whole forward and backward as root parameters would be.

    Gradients are reduced in fp32 whatever the compute dtype, so bf16 training sums exactly
    enough bits across ranks.
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    fully_shard(model.tok_embeddings, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # Backward starts with the last block: keeping it unsharded after forward saves an all-gather.
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    # Used last in forward and first in backward: resharding it in between would only re-gather it.
    fully_shard([model.norm, model.output], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def parallelize(model: nn.Module, mesh: DeviceMesh, *, param_dtype: torch.dtype, activation_checkpoint: str,
                compile: bool) -> nn.Module:
    apply_activation_checkpointing(model, activation_checkpoint)
    if compile:
        apply_compile(model)
    apply_fsdp(model, mesh, param_dtype)
    return model


def build_model(args, mesh: DeviceMesh, *, device: torch.device, seed: int, param_dtype: torch.dtype,
                activation_checkpoint: str, compile: bool) -> nn.Module:
    """The model for ``args``, sharded over ``mesh``, each rank holding only its shards, with its
    initial weights drawn from ``seed``: the same values for any world size (trainer/init.py)."""
    model = allocate_sharded(args, mesh, device=device, param_dtype=param_dtype,
                             activation_checkpoint=activation_checkpoint, compile=compile)
    model.init_weights(seed)
    return model


def allocate_sharded(args, mesh: DeviceMesh, *, device: torch.device, param_dtype: torch.dtype,
                     activation_checkpoint: str, compile: bool) -> nn.Module:
    """Build on the meta device (shapes, no memory), wrap (activation checkpointing, compile,
    FSDP2), then ``to_empty``: this rank's shards allocated on ``device``, not yet initialised."""
    from .model import Transformer

    with torch.device("meta"):
        model = Transformer(args)
    parallelize(model, mesh, param_dtype=param_dtype, activation_checkpoint=activation_checkpoint, compile=compile)
    model.to_empty(device=device)
    return model
