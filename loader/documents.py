"""Document boundaries of packed rows, from the manifest's document index (``Loader(documents=True)``).

A packed row holds the ends and starts of several documents. For every row a batch serves, the
document index's spans of that row (sorted by start) say where each document begins; from those:

- ``position_ids`` ``(rows, seq_len)`` int64: for each input token its offset from the start of
  its document within the row. It restarts at 0 at each document start and at the row's first
  token (a document continued from the previous row restarts too: the model sees no earlier
  token of it, as Megatron's ``reset_position_ids`` does).
- ``cu_seqlens`` ``(documents + 1,)`` int32: the cumulative lengths of the row segments over the
  whole batch flattened row after row, starting at 0 and ending at ``rows * seq_len`` (the
  flash-attn ``flash_attn_varlen_func`` convention); ``max_seqlen``: the longest segment.

Only the inputs (``tokens[:, :-1]``) are segmented: a span that starts at the row's last token
starts in the labels alone. The boundaries depend only on (shard, row), which the order derives
from (seed, global index): the pure-function contract holds with documents too.

Memory: the index's ``row`` keys (int64) and ``start`` (int32) of every span stay in memory,
12 bytes a span (about 1.2 GB for 100M spans).

A mixture (:class:`MixtureBoundaries`): every row it serves is one component's shard row, so the
row's boundaries are that component's, from its own document index (each read once and
hash-checked); still a function of (mixture hash, seed, global index), 12 bytes a span of each.
"""
from __future__ import annotations

import numpy as np

from gristmill.errors import UsageError
from gristmill.manifests import Published
from gristmill.manifests.doc_index import read_published_doc_index, row_offsets
from gristmill.manifests.mixture import PublishedMixture

from .tensors import torch


def document_boundaries(published, storage_options: dict | None = None):
    """The boundaries of a dataset version's rows, or of a mixture's (each component's own index)."""
    if isinstance(published, PublishedMixture):
        return MixtureBoundaries(published, storage_options)
    return DocumentBoundaries(published, storage_options)


class DocumentBoundaries:
    """The span starts of every row of one published manifest, looked up by (shard, row)."""

    def __init__(self, published: Published, storage_options: dict | None = None):
        if not isinstance(published, Published):  # e.g. a bare Manifest: no URL to read the index from
            raise UsageError(f"documents=True reads a published dataset version's document index; "
                             f"{type(published).__name__} has none of its own (pass a Published or a PublishedMixture)")
        m = published.manifest
        spans = read_published_doc_index(published, columns=["shard", "row", "start"], storage_options=storage_options)
        self.offsets = row_offsets(m)
        shard = spans.column("shard").to_numpy().astype(np.int64)
        # The index is sorted by (shard, row, start), so these keys are sorted: a row's spans are one run.
        self.keys = self.offsets[shard] + spans.column("row").to_numpy()
        self.starts = spans.column("start").to_numpy().astype(np.int32)  # < seq_len: 4 bytes a span is enough
        self.seq_len = m.seq_len

    def segment_starts(self, shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``(n, seq_len)`` bool: True where an input token starts a segment (a document, or the row)."""
        keys = self.offsets[np.asarray(shards, dtype=np.int64)] + np.asarray(rows, dtype=np.int64)
        lo, hi = np.searchsorted(self.keys, keys, "left"), np.searchsorted(self.keys, keys, "right")
        counts = hi - lo
        which = np.repeat(np.arange(keys.size), counts)  # the batch row of each span
        first = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(which.size)
        start = self.starts[first]
        inputs = start < self.seq_len
        out = np.zeros((keys.size, self.seq_len), dtype=bool)
        out[which[inputs], start[inputs]] = True
        out[:, 0] = True  # what the row shows of a document continued from the previous row is a segment too
        return out

    def batch(self, shards: np.ndarray, rows: np.ndarray, numpy: bool = False) -> dict:
        """``position_ids``, ``cu_seqlens`` and ``max_seqlen`` of the rows (shard, row), in batch order."""
        return segments_to_batch(self.segment_starts(shards, rows), numpy)


class MixtureBoundaries:
    """A mixture's rows, looked up by the mixture order's (shard, row): shards numbered over the
    components' shards concatenated in manifest order (``MixtureOrder.shards``); each row's spans
    come from the :class:`DocumentBoundaries` of the component that owns its shard."""

    def __init__(self, mixture: PublishedMixture, storage_options: dict | None = None):
        self.components = [DocumentBoundaries(pub, storage_options) for pub in mixture.components]
        self.shard_base = np.cumsum([0] + [len(pub.manifest.shards) for pub in mixture.components], dtype=np.int64)
        self.seq_len = mixture.manifest.seq_len

    def segment_starts(self, shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
        shards, rows = np.asarray(shards, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        owner = np.searchsorted(self.shard_base, shards, "right") - 1
        out = np.empty((shards.size, self.seq_len), dtype=bool)
        for c, bounds in enumerate(self.components):
            sel = owner == c
            out[sel] = bounds.segment_starts(shards[sel] - self.shard_base[c], rows[sel])
        return out

    def batch(self, shards: np.ndarray, rows: np.ndarray, numpy: bool = False) -> dict:
        return segments_to_batch(self.segment_starts(shards, rows), numpy)


def segments_to_batch(is_start: np.ndarray, numpy: bool = False) -> dict:
    """position ids and cu_seqlens from a ``(n, S)`` bool matrix of segment starts (column 0 all True); torch
    tensors, or with ``numpy`` the arrays (the server's: no torch)."""
    n, S = is_start.shape
    col = np.arange(S, dtype=np.int64)
    seg_start = np.maximum.accumulate(np.where(is_start, col, 0), axis=1)
    bounds = np.append(np.flatnonzero(is_start.reshape(-1)), n * S).astype(np.int32)
    position_ids, max_seqlen = col - seg_start, int(np.diff(bounds).max()) if n else 0
    if numpy:
        return {"position_ids": position_ids, "cu_seqlens": bounds, "max_seqlen": max_seqlen}
    t = torch()
    return {"position_ids": t.from_numpy(position_ids), "cu_seqlens": t.from_numpy(bounds), "max_seqlen": max_seqlen}
