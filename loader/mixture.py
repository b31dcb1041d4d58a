"""The order of a mixture: global index -> (component, its sample) -> (shard, row), a pure function.

Which component global index ``i`` reads is a function of the mixture's integer ``parts``
alone (``p_c``, summing to the period ``Q``): a deterministic, error-minimising interleave
computed once per process for one period and repeated, so locating any index is two table
lookups (``i mod Q``) and no walk from 0. Within a component, its ``k``-th sample is the
component's own order (loader.order, the same code as a plain dataset) under a seed derived
from (seed, component sha256): its epochs, each a fresh permutation, are what ``repeat``
serves when the component runs out.

The interleave is earliest-deadline-first with release times (the quota schedule of the
"chairman assignment problem"): at slot ``n = i + 1``, component ``c`` having served ``x_c``
samples is *eligible* when ``x_c < ceil(n p_c / Q)`` (serving it cannot put it above its
quota) and its next sample's *deadline* is ``ceil((x_c + 1) Q / p_c)``; the eligible component
with the earliest deadline is served, ties to the earlier component. All integer arithmetic.
It keeps ``floor(w_c n) <= x_c(n) <= ceil(w_c n)`` for every prefix ``n`` (``w_c = p_c / Q``),
so ``|x_c(n) - w_c n| < 1``, and every window of ``N`` samples holds ``w_c N`` of component
``c`` to within 2 (strictly); the proof is in docs/mixtures.md. Megatron's BlendedDataset rule
(serve the largest ``w_c (n) - x_c``) can fall more than one sample behind on some weights.
"""
from __future__ import annotations

import functools

import numpy as np

from gristmill.errors import UsageError
from gristmill.jit import cached_njit
from gristmill.manifests.mixture import PublishedMixture

from .order import DEFAULT_WINDOW_SHARDS, Order, derive_key

_TAG_COMPONENT = np.uint64(0x6D6978636F6D70)  # "mixcomp": component seeds never share keys with the orders' own


@cached_njit()
def _quota_schedule(parts: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    q = parts.sum()
    k = parts.size
    served = np.zeros(k, np.int64)
    out = np.empty(q, np.int32)
    for n in range(1, q + 1):
        best = -1
        for c in range(k):
            if served[c] * q < n * parts[c]:  # eligible: x_c < n p_c / Q, i.e. x_c < ceil(n p_c / Q)
                # deadline (x_c + 1) / p_c, compared exactly: (x_c + 1) p_b < (x_b + 1) p_c
                if best < 0 or (served[c] + 1) * parts[best] < (served[best] + 1) * parts[c]:
                    best = c
        out[n - 1] = best
        served[best] += 1
    return out


@functools.lru_cache(maxsize=8)
def period_table(parts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """For one period: the component of each slot, the slot's rank among its component's slots,
    and each component's slot positions."""
    comp = _quota_schedule(np.asarray(parts, dtype=np.int64))
    positions = tuple(np.flatnonzero(comp == c).astype(np.int32) for c in range(len(parts)))
    rank = np.empty(comp.size, np.int32)
    for pos in positions:
        rank[pos] = np.arange(pos.size, dtype=np.int32)
    return comp, rank, positions


def interleave(parts, indices) -> tuple[np.ndarray, np.ndarray]:
    """Global indices -> (component, that component's sample number k), vectorised."""
    parts_arr = np.asarray(parts, dtype=np.int64)
    comp_of, rank_of, _ = period_table(tuple(int(p) for p in parts))
    g = np.asarray(indices, dtype=np.int64)
    if g.size and g.min() < 0:
        raise UsageError(f"global indices must be >= 0, got {int(g.min())}")
    q, r = np.divmod(g, comp_of.size)
    comp = comp_of[r].astype(np.int64)
    return comp, q * parts_arr[comp] + rank_of[r]


def index_of(parts, component: int, k: int) -> int:
    """The global index of component ``component``'s ``k``-th sample (0-based): the inverse of :func:`interleave`."""
    _, _, positions = period_table(tuple(int(p) for p in parts))
    q, j = divmod(int(k), int(parts[component]))
    return q * sum(int(p) for p in parts) + int(positions[component][j])


def component_seed(seed: int, sha256: str) -> int:
    """The seed of one component's own order: a function of (seed, its manifest hash)."""
    return int(derive_key(seed, _TAG_COMPONENT, int(sha256[:16], 16), int(sha256[16:32], 16)))


class MixtureOrder:
    """The order of one split of a mixture for one seed, with :class:`loader.order.Order`'s interface
    (``locate``, ``num_samples``, ``shard_ids``, ``rows``) over the components' shards concatenated
    in manifest order (``shards``), plus :meth:`locate_components` for the audit."""

    def __init__(self, mixture: PublishedMixture, split: str, seed: int, order: str = "global",
                 window_shards: int = DEFAULT_WINDOW_SHARDS):
        m = mixture.manifest
        self.mixture, self.split, self.seed, self.order = mixture, split, int(seed), order
        self.parts = np.array([c.parts for c in m.components], dtype=np.int64)
        self.orders = [Order(pub.manifest, split, component_seed(seed, c.sha256), order, window_shards)
                       for c, pub in zip(m.components, mixture.components)]
        counts = [len(pub.manifest.shards) for pub in mixture.components]
        self.shard_base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.shards = tuple(s for pub in mixture.components for s in pub.manifest.shards)
        self.shard_ids = np.concatenate([o.shard_ids + b for o, b in zip(self.orders, self.shard_base)])
        self.rows = np.concatenate([o.rows for o in self.orders])
        self.streams = len(self.orders)  # each component reads its own window of shards at a time
        # Where the mixture ends: the first index at which a component would need a sample past its
        # limit (its rows under "stop", its token budget). None: endless.
        ends = [index_of(self.parts, c, limit) for c, limit in enumerate(self.limits()) if limit is not None]
        self.num_samples = min(ends) if ends else None

    def limits(self) -> list[int | None]:
        """Per component, the samples of this split it may serve (None: any number)."""
        out = []
        for c, o in zip(self.mixture.manifest.components, self.orders):
            caps = [x for x in (c.budget_samples if self.split == "train" else None,
                                o.num_samples if c.exhausted == "stop" else None) if x is not None]
            out.append(min(caps) if caps else None)
        return out

    def stop_index(self, epochs: int | None) -> int | None:
        """The Loader's end: where the mixture ends; ``epochs`` has no meaning for a blend except 1 = to its end."""
        if epochs not in (None, 1):
            raise UsageError(f"epochs={epochs}: a mixture has no epochs (each component repeats or stops by its own "
                             f"policy); use None, or 1 for a finite mixture's end")
        if epochs == 1 and self.num_samples is None:
            raise UsageError("epochs=1: this mixture is endless (every component repeats, no token budget)")
        return self.num_samples

    def locate_components(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Global indices -> (component, its sample number, shard position in that component's manifest, row)."""
        comp, k = interleave(self.parts, indices)
        shard, row = np.empty_like(k), np.empty_like(k)
        for c, o in enumerate(self.orders):
            sel = comp == c
            if sel.any():
                shard[sel], row[sel] = o.locate(k[sel])
        return comp, k, shard, row

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        comp, _, shard, row = self.locate_components(indices)
        return self.shard_base[comp] + shard, row
