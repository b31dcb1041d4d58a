"""The sample order: a pure function from a global sample index to (shard, row).

Global index ``g`` of a split with ``N`` rows falls in epoch ``g // N`` at position ``g % N``;
every epoch is a fresh permutation of all ``N`` rows, keyed by (seed, epoch). Nothing here
keeps per-sample state, so the loader, a resumed run at another world size and the audit all
compute the same answer from (manifest, split, seed, order, index).

Three orders:

- ``global``: a keyed pseudo-random permutation of all rows (a Feistel network over the
  smallest power-of-four domain >= N, with cycle-walking back into [0, N)). O(1) memory,
  a true shuffle; but consecutive samples come from any shard, so the whole split is read
  at random and should fit in the local cache.
- ``window``: the shards are permuted, cut into windows of ``window_shards`` consecutive
  shards, and the rows of each window are permuted among themselves. At any moment a run
  reads from at most two windows, so the cache needs only ~2 windows of shards; the price is
  that a sample only mixes with the samples of its own window within an epoch.
- ``sequential``: rows in manifest order, the same every epoch (validation loss).

Everything is vectorised over numpy arrays: mapping a million indices takes well under a
second, which is what the audit needs to answer "what did steps A..B see".
"""
from __future__ import annotations

import numpy as np

from gristmill.manifests import Manifest
from gristmill.errors import UsageError

ORDERS = ("global", "window", "sequential")
DEFAULT_WINDOW_SHARDS = 8
FEISTEL_ROUNDS = 8

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
# Domain-separation tags so the shard permutation and the row permutations never share keys.
_TAG_GLOBAL, _TAG_SHARDS, _TAG_WINDOW = _U64(0x676C6F62616C), _U64(0x736861726473), _U64(0x77696E646F77)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-mixing bijection on uint64 (wraps by design)."""
    with np.errstate(over="ignore"):  # 0-d inputs become numpy scalars, which warn on wrap-around
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def derive_key(seed: int, tag: np.uint64, *parts) -> np.ndarray:
    """A 64-bit key from the seed, a tag and integer parts (scalars or arrays: broadcast)."""
    k = _mix64(np.asarray(int(seed) & 0xFFFFFFFFFFFFFFFF, dtype=_U64) ^ tag)
    for p in parts:
        with np.errstate(over="ignore"):
            k = _mix64(k ^ _mix64(np.asarray(p, dtype=_U64) + _GOLDEN))
    return k


def _half_bits(n: np.ndarray) -> np.ndarray:
    """Bits per Feistel half: the smallest h >= 1 with 4**h >= n."""
    bits = np.ceil(np.log2(np.maximum(n, 2).astype(np.float64))).astype(np.int64)
    # log2 of large integers in float64 can be off by one at exact powers of two: fix up.
    bits = np.where((np.uint64(1) << bits.astype(_U64)) < n, bits + 1, bits)
    return np.maximum((bits + 1) // 2, 1).astype(_U64)


def feistel(x, n, key) -> np.ndarray:
    """A keyed permutation of [0, n), applied elementwise to ``x`` (x, n, key broadcast).

    A balanced Feistel network permutes [0, 4**h); values that land outside [0, n) are
    permuted again (cycle-walking) until they land inside, which keeps it a bijection on
    [0, n). Since 4**h < 4n, that takes fewer than 4 passes on average.
    """
    x, n, key = np.broadcast_arrays(np.asarray(x, dtype=_U64), np.asarray(n, dtype=_U64), np.asarray(key, dtype=_U64))
    if x.size and np.any(x >= n):
        raise ValueError(f"feistel: index {int(x[x >= n].flat[0])} outside [0, n)")
    h = _half_bits(n)
    mask = (_U64(1) << h) - _U64(1)
    with np.errstate(over="ignore"):
        round_keys = [_mix64(key + _U64(r) * _GOLDEN) for r in range(FEISTEL_ROUNDS)]
    out = x.copy()
    todo = np.arange(out.size)  # positions still outside [0, n) (all of them before the first pass)
    flat_out, flat_n, flat_h, flat_mask = out.reshape(-1), n.reshape(-1), h.reshape(-1), mask.reshape(-1)
    flat_keys = [k.reshape(-1) for k in round_keys]
    while todo.size:
        hh, mm = flat_h[todo], flat_mask[todo]
        v = flat_out[todo]
        left, right = v >> hh, v & mm
        for rk in flat_keys:
            left, right = right, left ^ (_mix64(right ^ rk[todo]) & mm)
        v = (left << hh) | right
        flat_out[todo] = v
        todo = todo[v >= flat_n[todo]]
    return out


class Order:
    """The order of one split of one manifest for one seed: ``locate(indices) -> (shard, row)``.

    ``shard`` is the shard's position in ``manifest.shards`` (the doc index's ``shard`` column),
    ``row`` the row inside it. Construction is O(shards); ``locate`` is pure and vectorised.
    """

    streams = 1  # independent streams of rows read at once (a mixture's order has one per component)

    def __init__(self, manifest: Manifest, split: str, seed: int, order: str = "global",
                 window_shards: int = DEFAULT_WINDOW_SHARDS):
        if order not in ORDERS:
            raise UsageError(f"order must be one of {ORDERS}, got {order!r}")
        if order == "window" and int(window_shards) < 1:
            raise UsageError(f"window_shards must be >= 1, got {window_shards!r}")
        self.shard_ids = np.array([i for i, s in enumerate(manifest.shards) if s.split == split], dtype=np.int64)
        if self.shard_ids.size == 0:
            raise UsageError(f"manifest {manifest.dataset!r} has no shards in split {split!r}")
        self.rows = np.array([manifest.shards[i].rows for i in self.shard_ids], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.rows)])  # split-local row offsets
        self.num_samples = int(self.offsets[-1])
        if self.num_samples == 0:
            raise UsageError(f"split {split!r} of manifest {manifest.dataset!r} has no rows")
        self.split, self.seed, self.order, self.window_shards = split, int(seed), order, int(window_shards)
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # -- public --------------------------------------------------------------------------
    def stop_index(self, epochs: int | None) -> int | None:
        """The first global index past ``epochs`` epochs (None: endless)."""
        return None if epochs is None else epochs * self.num_samples

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Global sample indices (any int array) -> (shard positions in manifest.shards, rows)."""
        g = np.asarray(indices, dtype=np.int64)
        if g.size and g.min() < 0:
            raise UsageError(f"global indices must be >= 0, got {int(g.min())}")
        epoch, pos = np.divmod(g, self.num_samples)
        if self.order == "sequential":
            flat = pos  # split-local flat row position
        elif self.order == "global":  # keys vectorise over epochs too
            flat = feistel(pos, self.num_samples, derive_key(self.seed, _TAG_GLOBAL, epoch)).astype(np.int64)
        else:  # the window layout is per epoch; a run spans few epochs
            flat = np.empty(g.shape, dtype=np.int64)
            for e in np.unique(epoch):
                sel = epoch == e
                flat[sel] = self._window(int(e), pos[sel])
        local = np.searchsorted(self.offsets, flat, side="right") - 1
        return self.shard_ids[local], flat - self.offsets[local]

    # -- the window order ----------------------------------------------------------------
    def _window_layout(self, epoch: int):
        """This epoch's shard permutation, its row offsets, and the window starts."""
        if epoch not in self._epochs:
            n = self.shard_ids.size
            perm = feistel(np.arange(n), n, derive_key(self.seed, _TAG_SHARDS, epoch)).astype(np.int64)
            perm_offsets = np.concatenate([[0], np.cumsum(self.rows[perm])])
            window_starts = perm_offsets[0:n:self.window_shards]
            window_ends = perm_offsets[np.minimum(np.arange(window_starts.size) * self.window_shards + self.window_shards, n)]
            if len(self._epochs) > 4:  # a run touches one or two epochs at a time
                self._epochs.clear()
            self._epochs[epoch] = (perm, perm_offsets, np.stack([window_starts, window_ends]))
        return self._epochs[epoch]

    def _window(self, epoch: int, pos: np.ndarray) -> np.ndarray:
        perm, perm_offsets, (starts, ends) = self._window_layout(epoch)
        w = np.searchsorted(starts, pos, side="right") - 1
        key = derive_key(self.seed, _TAG_WINDOW, epoch, w)
        p = starts[w] + feistel(pos - starts[w], ends[w] - starts[w], key).astype(np.int64)
        q = np.searchsorted(perm_offsets, p, side="right") - 1  # position in the permuted shard list
        shard_local = perm[q]
        return self.offsets[shard_local] + (p - perm_offsets[q])


def samples_at(manifest: Manifest, split: str, seed: int, order: str, indices,
               window: int = DEFAULT_WINDOW_SHARDS) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`sample_at`: an array of global indices -> (shard array, row array)."""
    return Order(manifest, split, seed, order, window).locate(indices)


def sample_at(manifest: Manifest, split: str, seed: int, order: str, global_index: int,
              window: int = DEFAULT_WINDOW_SHARDS) -> tuple[int, int]:
    """Which (shard position in manifest.shards, row) global index ``global_index`` reads."""
    shard, row = samples_at(manifest, split, seed, order, [int(global_index)], window)
    return int(shard[0]), int(row[0])
