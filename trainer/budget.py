"""The run's arithmetic before it runs: memory per rank, term by term, and the planned compute.
Pure functions of the model shape and the job; docs/trainer.md ("Budgets") has the
formulas with worked numbers, and tests/test_trainer_budget.py checks them.

Memory per rank, for N parameters sharded over D ranks (FSDP2 with a bf16 compute dtype and fp32
gradient reduction, AdamW):

- persistent, sharded (16 bytes per parameter, / D): fp32 master weights 4, fp32 gradients 4,
  Adam moments 8 (two fp32 tensors). ZeRO's accounting reaches the same 16 as 2 + 2 + 12 (bf16
  weights and gradients, fp32 master and moments); FSDP2 keeps the gradient shard in fp32 and the
  bf16 weights only while a unit is gathered, which is the next term.
- transient, unsharded: the compute-dtype weights of the units gathered at once (two blocks,
  current and prefetched, plus the final norm + output head unit, which stays gathered from the
  end of forward to the start of backward) and one unit's gradients before their reduce-scatter
  (compute dtype, plus the fp32 copy reduced).
- activations of one micro-batch of T = micro_batch x seq_len tokens, per layer and token (h
  model dim, f ffn dim, k = n_kv_heads x head_dim, c the compute dtype's bytes):
  ``none``: 12h + 4k (fp32: the norms' inputs, the rotary inputs) + c(8h + 4f) (norm outputs,
  attention inputs and output, SwiGLU's four f-wide tensors); ``selective``: c(5h + 2k + 2f) (the
  block input, the matmul outputs and the attention output); ``full``: c h (the block input) per
  layer, plus one layer's ``none`` activations recomputed in backward; and for the head
  (c + 8) V per token at the loss (logits, their fp32 copy, the log-softmax).

Compute: 6 N' D + 12 L h s D FLOPs for D tokens (N' the parameters that take part in matmuls:
all but the input embedding), as model.flops_per_token.
"""
from __future__ import annotations

from dataclasses import dataclass

from .model import count_params

GB = 1e9


def state_bytes(n_params: int, shards: int) -> dict[str, float]:
    """The 16 bytes per parameter that persist, divided over ``shards`` ranks, term by term."""
    return {"fp32 master weights": 4.0 * n_params / shards, "fp32 gradients": 4.0 * n_params / shards,
            "Adam moments (2 x fp32)": 8.0 * n_params / shards}


def activation_bytes_per_token(args, mode: str, compute_bytes: int) -> dict[str, float]:
    """Saved-for-backward bytes per token: ``layer`` per layer, ``head`` at the loss, and
    ``recompute`` (one layer's full activations, rebuilt in backward under ``full``)."""
    h, f, c = args.dim, args.ffn_dim, compute_bytes
    k = args.n_kv_heads * args.head_dim
    full_layer = 12 * h + 4 * k + c * (8 * h + 4 * f)
    per_layer = {"none": full_layer, "selective": c * (5 * h + 2 * k + 2 * f), "full": c * h}
    if mode not in per_layer:
        raise ValueError(f"activation checkpointing mode {mode!r}: expected one of {', '.join(per_layer)}")
    return {"layer": float(per_layer[mode]), "head": float((c + 8) * args.vocab_size),
            "recompute": float(full_layer if mode == "full" else 0)}


@dataclass(frozen=True)
class MemoryBudget:
    terms: dict[str, float]  # name -> bytes per rank
    n_params: int
    shards: int

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    def describe(self) -> str:
        parts = "; ".join(f"{name} {format_bytes(value)}" for name, value in self.terms.items())
        return f"{parts}; total {format_bytes(self.total)}"


def memory_budget(args, *, n_params: int, shards: int, compute_bytes: int, micro_batch: int, seq_len: int,
                  activation_checkpoint: str) -> MemoryBudget:
    """Bytes per rank, term by term (see the module docstring)."""
    units = count_params(args)
    c = compute_bytes
    tokens = micro_batch * seq_len
    act = activation_bytes_per_token(args, activation_checkpoint, c)
    biggest = max(units["block"], units["head"])
    terms = {**state_bytes(n_params, shards),
             f"gathered {c}-byte weights (2 blocks + norm/head)": float(c * (2 * units["block"] + units["head"])),
             "one unit's unsharded gradients": float((c + 4) * biggest),
             f"activations ({activation_checkpoint}, {tokens:,} tokens)":
                 tokens * (args.n_layers * act["layer"] + act["recompute"]),
             "logits and loss": tokens * act["head"]}
    return MemoryBudget(terms, n_params, shards)


def available_bytes(device) -> tuple[int, str]:
    """(bytes one rank may use, what they are): a GPU's total memory, or on CPU the host's
    physical memory shared by the ranks on it (``LOCAL_WORLD_SIZE``, set by torchrun)."""
    import os

    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[1]), f"the {torch.cuda.get_device_name(device)}'s memory"
    ranks = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), 1)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // ranks, "this host's memory" + (f" / {ranks} ranks on it" if ranks > 1 else "")


# Which job key moves each term (for the message when a budget cannot fit).
_KNOBS = (("activations", "data.micro_batch (or data.global_batch), or parallelism.activation_checkpoint"),
          ("logits", "data.micro_batch (or data.global_batch)"),
          ("", "model.dim / model.n_layers / model.ffn_dim (a smaller model.preset), or more ranks"))


def check_fits(budget: MemoryBudget, available: int, what: str) -> None:
    """Refuse, before anything is allocated, a run whose memory per rank exceeds what the device
    has: one line naming the largest term and the job keys that shrink it (a traceback from deep
    inside torch's allocator, minutes in, once stood for this)."""
    from gristmill.errors import ConfigError

    if budget.total <= available:
        return
    name, value = max(budget.terms.items(), key=lambda kv: kv[1])
    knob = next(k for key, k in _KNOBS if key in name)
    raise ConfigError(f"the run needs {format_bytes(budget.total)} per rank, more than {what} "
                      f"({format_bytes(available)}); the largest term is {name} at {format_bytes(value)}: lower {knob}")


def planned_flops(flops_per_token_matmul: float, flops_per_token_attention: float, tokens: int) -> dict[str, float]:
    """The run's compute: the 6 N' D matmul term and the attention term, for ``tokens`` tokens."""
    matmul, attention = flops_per_token_matmul * tokens, flops_per_token_attention * tokens
    return {"6ND": matmul, "attention": attention, "total": matmul + attention}


def expected_wall_s(flops: float, *, mfu: float, peak_flops_per_device: float, devices: int) -> float:
    """Seconds to do ``flops`` on ``devices`` devices at utilisation ``mfu`` of their peak."""
    return flops / (mfu * peak_flops_per_device * devices)


def format_bytes(n: float) -> str:
    for unit, size in (("GB", GB), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"
