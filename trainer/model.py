"""A plain Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, causal attention.

Attention goes through ``F.scaled_dot_product_attention`` (its flash kernel on GPU and CPU) or,
on GPU in bf16 when the ``flash-attn`` package is installed, through ``flash_attn_func``.

``document_mask=True`` (with the loader's ``position_ids``, see loader/documents.py): rotary
positions restart at each document, and a token attends only to earlier tokens of its own
document. The kernel (:class:`DocumentMask`): flash-attn's ``flash_attn_varlen_func`` over
``cu_seqlens`` on GPU with ``attention="flash"``; otherwise flex attention with a block mask on
GPU (only the blocks a document touches are computed); on CPU SDPA with a dense boolean
``(B, 1, S, S)`` mask (flex attention has no backward on CPU in torch 2.13).

The trainer builds it on the meta device (no memory), shards it (``trainer.parallelize``), then
allocates each rank's shards and draws them with ``init_weights``: the initial weights depend on
the seed only, never on the world size (trainer/init.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from gristmill.errors import UsageError


# ModelArgs fields that choose kernels, not weights: a checkpoint resumes whatever they are.
KERNEL_FIELDS = ("attention", "document_mask")


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int = 512
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 4
    ffn_dim: int = 172
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    attention: str = "sdpa"  # sdpa | flash (resolved by trainer.parallelize.resolve_attention)
    document_mask: bool = False  # mask attention across documents, restart rope (needs position ids)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


# Sizes follow the Llama family's shapes (ffn ~ 8/3 * dim, rounded); vocab comes from the manifest.
PRESETS: dict[str, ModelArgs] = {
    "tiny": ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=172),
    "small": ModelArgs(dim=256, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=688),
    "125m": ModelArgs(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_dim=2048),
    "350m": ModelArgs(dim=1024, n_layers=24, n_heads=16, n_kv_heads=16, ffn_dim=2816),
    "1b": ModelArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, rope_theta=500000.0),
    "3b": ModelArgs(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim=8192, rope_theta=500000.0),
    "8b": ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, rope_theta=500000.0),
}


def model_args(preset: str, vocab_size: int, max_seq_len: int, **overrides) -> ModelArgs:
    if preset not in PRESETS:
        raise UsageError(f"model.preset: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    args = replace(PRESETS[preset], vocab_size=vocab_size, max_seq_len=max_seq_len,
                   **{k: v for k, v in overrides.items() if v is not None})
    if args.dim % args.n_heads or args.n_heads % args.n_kv_heads:
        raise UsageError(f"model: dim ({args.dim}) must divide by n_heads ({args.n_heads}) and n_heads by "
                         f"n_kv_heads ({args.n_kv_heads})")
    return args


def position_ids(batch: dict, device, n_micro: int) -> list:
    """The batch's ``position_ids`` on ``device`` cut into ``n_micro`` micro-batches, or
    ``n_micro`` Nones when the loader served none (``documents=False``)."""
    pos = batch.get("position_ids")
    return [None] * n_micro if pos is None else list(pos.to(device, non_blocking=True).chunk(n_micro))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Normalise in fp32 whatever the compute dtype: bf16 variance loses too many bits.
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (S, D/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of ``x`` (B, S, H, D) by position-dependent angles: ``cos``/``sin``
    are (S, D/2) for positions 0..S-1 in every row, or (B, S, D/2) per row (position ids)."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = (cos[None, :, None, :], sin[None, :, None, :]) if cos.dim() == 2 else (cos[:, :, None], sin[:, :, None])
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


def _flash_attn(varlen: bool = False):
    try:
        from flash_attn import flash_attn_func, flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func if varlen else flash_attn_func


_compiled_flex = None


def _flex_attention():
    """flex_attention compiled once per process: eager flex materialises the whole score matrix."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


class DocumentMask:
    """Causal attention within documents, for one batch: built once per forward from the position
    ids (a document starts where its position id is 0) and shared by every layer.

    ``kernel``: ``"varlen"`` (flash-attn over ``cu_seqlens``), ``"flex"`` (a flex-attention block
    mask) or ``"dense"`` (an SDPA boolean mask); :meth:`choose` picks the fastest available one.
    """

    def __init__(self, position_ids: torch.Tensor, kernel: str):
        B, S = position_ids.shape
        self.kernel = kernel
        starts = position_ids == 0
        if kernel == "varlen":
            flat = torch.cat([torch.nonzero(starts.reshape(-1)).flatten(),
                              torch.tensor([B * S], device=position_ids.device)])
            self.cu_seqlens = flat.to(torch.int32)
            self.max_seqlen = int(flat.diff().max())  # one host sync per forward, not per layer
            return
        doc = starts.cumsum(1)  # document number of each token within its row
        if kernel == "flex":
            from torch.nn.attention.flex_attention import create_block_mask

            def same_document_causal(b, h, q, k):
                return (q >= k) & (doc[b, q] == doc[b, k])

            self.block_mask = create_block_mask(same_document_causal, B, None, S, S, device=position_ids.device)
        elif kernel == "dense":
            causal = torch.ones(S, S, dtype=torch.bool, device=position_ids.device).tril()
            self.mask = (causal & (doc[:, :, None] == doc[:, None, :]))[:, None]  # (B, 1, S, S)
        else:
            raise ValueError(f"DocumentMask: unknown kernel {kernel!r}")

    @staticmethod
    def choose(attention: str, x: torch.Tensor) -> str:
        if attention == "flash" and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and _flash_attn(True):
            return "varlen"
        return "flex" if x.is_cuda else "dense"


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.attention = args.attention
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x, cos, sin, documents: DocumentMask | None = None):
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, S, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, S, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kernel = documents.kernel if documents is not None else None
        if kernel == "varlen":  # (B*S, H, D) packed; grouped KV heads handled by the kernel
            out = _flash_attn(True)(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), documents.cu_seqlens,
                                    documents.cu_seqlens, documents.max_seqlen, documents.max_seqlen, causal=True)
            out = out.view(B, S, self.n_heads, self.head_dim)
        elif kernel == "flex":
            out = _flex_attention()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    block_mask=documents.block_mask, enable_gqa=self.n_heads != self.n_kv_heads)
            out = out.transpose(1, 2)
        elif kernel is None and self.attention == "flash" and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
            out = _flash_attn()(q, k, v, causal=True)  # (B, S, H, D); handles grouped KV heads itself
        else:
            repeat = self.n_heads // self.n_kv_heads
            if repeat > 1:  # grouped-query attention: share each KV head across `repeat` query heads
                k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
            mask = {} if kernel is None else {"attn_mask": documents.mask}
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=kernel is None, **mask)
            out = out.transpose(1, 2)
        return self.wo(out.reshape(B, S, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim)

    def forward(self, x, cos, sin, documents: DocumentMask | None = None):
        x = x + self.attention(self.attention_norm(x), cos, sin, documents)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        # A ModuleDict keyed by layer number keeps checkpoint keys stable if layers are wrapped.
        self.layers = nn.ModuleDict({str(i): Block(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        # Not parameters and not in the checkpoint: recomputed from args on every start.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if not self.output.weight.is_meta:  # built on the meta device: the caller inits after sharding
            self.init_weights()

    @torch.no_grad()
    def init_weights(self, seed: int = 0):
        """Draw every parameter (this rank's shard of it, once sharded) from ``seed`` and recompute
        the rotary tables (``to_empty`` leaves buffers uninitialised too)."""
        from . import init

        # GPT-2 / OLMo style: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * layers).
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.args.n_layers)
        for name, p in self.named_parameters():
            name = init.canonical_name(name)
            if p.dim() == 1:
                init.ones_(p)  # RMSNorm gains
            else:
                init.normal_(p, name, seed=seed, std=out_std if name.endswith(("wo.weight", "w2.weight")) else std)
        cos, sin = rope_tables(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of ``tokens`` (B, S). ``position_ids`` (B, S): each token's offset in its document
        (the loader's ``documents=True`` batches); they set the rotary positions and, with
        ``document_mask``, the attention mask. Without them every row is one sequence."""
        S = tokens.shape[1]
        if S > self.args.max_seq_len:
            raise UsageError(f"sequence of {S} tokens is longer than the model's max_seq_len {self.args.max_seq_len}")
        documents, h = None, self.tok_embeddings(tokens)
        if position_ids is None:
            if self.args.document_mask:
                raise UsageError("model.document_mask needs the batch's position_ids: load batches with "
                                 "Loader(..., documents=True)")
            cos, sin = self.rope_cos[:S], self.rope_sin[:S]
        else:
            if position_ids.shape != tokens.shape[:2]:
                raise UsageError(f"position_ids {tuple(position_ids.shape)} must have the tokens' shape {tuple(tokens.shape[:2])}")
            cos, sin = self.rope_cos[position_ids], self.rope_sin[position_ids]
            if self.args.document_mask:  # h: the compute device and dtype, under FSDP mixed precision too
                documents = DocumentMask(position_ids, DocumentMask.choose(self.args.attention, h))
        for layer in self.layers.values():
            h = layer(h, cos, sin, documents)
        return self.output(self.norm(h))


def count_params(args: ModelArgs) -> dict[str, int]:
    """Parameter counts from the shapes alone (no model needed, so it works for any preset)."""
    attn = args.dim * args.head_dim * (2 * args.n_heads + 2 * args.n_kv_heads)
    block = attn + 3 * args.dim * args.ffn_dim + 2 * args.dim
    embedding = args.vocab_size * args.dim
    head = args.dim + args.vocab_size * args.dim  # final norm + output head
    non_embedding = args.n_layers * block + head
    return {"total": non_embedding + embedding, "non_embedding": non_embedding, "embedding": embedding,
            "block": block, "head": head}


def flops_per_token_terms(args: ModelArgs, seq_len: int) -> tuple[float, float]:
    """Training FLOPs per token as (6N, 12*L*h*s): the matmuls (forward + backward) and attention.

    N counts the parameters that do matmuls (everything but the input embedding lookup), as in
    the PaLM appendix; 12*L*h*s is the attention score and value products, forward and backward.
    """
    return 6.0 * count_params(args)["non_embedding"], 12.0 * args.n_layers * args.dim * seq_len


def flops_per_token(args: ModelArgs, seq_len: int) -> float:
    return sum(flops_per_token_terms(args, seq_len))
