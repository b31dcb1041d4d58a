"""Which samples a run consumed, reconstructed from the checkpoint alone.

Optimizer step ``n`` (1-based, the trainer's numbering in ``step-<N>/``, metrics.jsonl and
samples.jsonl) with global batch ``B`` consumed global indices ``[(n-1)*B, n*B)``; rank ``r``
of ``W`` took the contiguous slice ``[(n-1)*B + r*B/W, (n-1)*B + (r+1)*B/W)``. Skips move that
(trainer/skips.py, one implementation): a rewind past a loss spike shifts every later step by the
indices it passed over, and a bad step's samples (a skipped non-finite update) count as consumed by
no update, so neither is ever "seen"; :func:`skipped` lists them for ``audit doc`` and ``audit steps``. The loader's
pure order function maps each global index to ``(shard, row)``. The audit calls that same
function, never a copy of it, so its answer is the loader's answer by construction.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gristmill.manifests import Manifest
from gristmill.trainer import skips as skips_

from .checkpoint import AuditError, Checkpoint


@dataclass(frozen=True)
class Consumed:
    """One entry per consumed global index, in training order (all int64 arrays)."""

    index: np.ndarray  # global sample index
    step: np.ndarray  # optimizer step (1-based)
    rank: np.ndarray  # rank that trained on it (-1: unknown, the run's world size then is not recorded)
    shard: np.ndarray  # position in manifest.shards
    row: np.ndarray  # row inside that shard

    def __len__(self) -> int:
        return len(self.index)


def parse_steps(text: str | None, ckpt: Checkpoint) -> tuple[int, int]:
    """``A:B`` -> steps A through B inclusive (1-based; either end optional; ``N`` alone is one step).

    The default is every step the checkpoint trained on its manifest.
    """
    first, last = ckpt.first_step, ckpt.step
    if last < first:
        raise AuditError(f"checkpoint {ckpt.path} has not trained any step on manifest {ckpt.manifest_sha256}")
    if not text:
        return first, last
    a, colon, b = text.partition(":")
    try:
        lo = int(a) if a else first
        hi = (int(b) if b else last) if colon else lo
    except ValueError:
        raise AuditError(f"--steps {text!r}: expected A:B (steps A to B, inclusive), A:, :B or one step N") from None
    if not 1 <= lo <= hi:
        raise AuditError(f"--steps {text!r}: need 1 <= A <= B (steps are numbered from 1, as in step-<N>)")
    if hi > last:
        raise AuditError(f"--steps {text!r}: checkpoint {ckpt.path} has trained only {last} steps")
    if lo < first:
        c = max(ckpt.manifest_changes, key=lambda c: int(c["step"]))
        raise AuditError(f"--steps {text!r}: steps before {first} were trained on manifest {c['from_sha256']} "
                         f"({c['from_url']}), not {ckpt.manifest_sha256}; audit them from a checkpoint of that segment")
    return lo, hi


def order_at(manifest: Manifest, ckpt: Checkpoint, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row) of every global index through the loader's one order implementation."""
    from gristmill.loader import order

    window = ckpt.window_shards if ckpt.window_shards is not None else order.DEFAULT_WINDOW_SHARDS
    shard, row = order.samples_at(manifest, ckpt.split, ckpt.seed, ckpt.order, indices, window)
    return np.asarray(shard, dtype=np.int64), np.asarray(row, dtype=np.int64)


def consumed(manifest: Manifest, ckpt: Checkpoint, steps: tuple[int, int] | None = None) -> Consumed:
    """The samples of steps ``first..last`` inclusive (default: every step on this manifest)."""
    index, step = trained_indices(ckpt, steps if steps is not None else parse_steps(None, ckpt))
    shard, row = order_at(manifest, ckpt, index)
    return Consumed(index=index, step=step, rank=ranks(index, step, ckpt), shard=shard, row=row)


def trained_indices(ckpt: Checkpoint, steps: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(global index, step) of the samples steps ``first..last`` trained on: past the rewinds, less bad steps."""
    index, step = skips_.step_indices(steps[0], steps[1], ckpt.global_batch, ckpt.skips)
    trained = ~skips_.bad_step_mask(index, ckpt.skips)
    return index[trained], step[trained]


def skipped_indices(ckpt: Checkpoint, steps: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(global index, step, position in ``ckpt.skips``) of the skipped samples whose step (the one that
    read it, or would have before a rewind) lies in ``steps`` (default: all)."""
    index, step, which = skips_.skipped_samples(ckpt.skips, ckpt.global_batch)
    if steps is not None:
        sel = (step >= steps[0]) & (step <= steps[1])
        index, step, which = index[sel], step[sel], which[sel]
    return index, step, which


def skipped(manifest: Manifest, ckpt: Checkpoint, steps: tuple[int, int] | None = None) -> tuple[Consumed, np.ndarray]:
    """The skipped samples whose step (the one that read it, or would have before a rewind) lies in
    ``steps`` (default: all), and for each its position in ``ckpt.skips``. A rewind's samples have rank -1:
    no rank trained them."""
    index, step, which = skipped_indices(ckpt, steps)
    shard, row = order_at(manifest, ckpt, index)
    rank = ranks(index, step, ckpt)
    rank[np.array([ckpt.skips[w]["kind"] == "rewind" for w in which], dtype=bool)] = -1
    return Consumed(index=index, step=step, rank=rank, shard=shard, row=row), which


def ranks(index: np.ndarray, step: np.ndarray, ckpt: Checkpoint) -> np.ndarray:
    """The rank of each sample at the world size of its step's segment of the run."""
    B = ckpt.global_batch
    rank = np.full(len(index), -1, dtype=np.int64)
    first = 1
    for last, world_size in ckpt.world_sizes:
        sel = (step >= first) & (step <= last)
        if world_size:
            rank[sel] = (index[sel] % B) // (B // world_size)
        first = last + 1
    return rank
