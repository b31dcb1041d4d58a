"""Connected components of a large edge list on Ray Data, with memory bounded per worker.

Alternating Large-Star / Small-Star (Kiveris et al., "Connected Components in MapReduce and
Beyond", SoCC 2014). Each step is one hash shuffle of the edges keyed by a node, then pure numpy
inside each partition, so a worker only ever holds its partition of the edges (never the whole
graph, unlike a single-process union-find). The steps:

- large-star: every node u links each *larger* neighbour v to m(u), u's smallest neighbour or u;
- small-star: every node u links each *smaller* neighbour v, and itself, to m, the smallest of them.

Both preserve connectivity; repeated until the edge set stops changing, the graph becomes one
star per component centred on the component's smallest node, in O(log^2 n) rounds (a few in
practice). Node ids are int64 (the documents' ``order``), so "smallest" is "earliest in input
order" and the result is the same whatever the partitioning.
"""
from __future__ import annotations

import numpy as np

_MAX_ROUNDS = 100


def _group_starts(keys: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in sorted ``keys``."""
    return np.flatnonzero(np.diff(keys, prepend=keys[:1] - 1)) if len(keys) else np.zeros(0, dtype=np.int64)


def _sorted_unique_edges(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (u, v) pairs sorted by u then v."""
    if len(u) == 0:
        return u, v
    order = np.lexsort((v, u))
    u, v = u[order], v[order]
    keep = np.ones(len(u), dtype=bool)
    keep[1:] = (u[1:] != u[:-1]) | (v[1:] != v[:-1])
    return u[keep], v[keep]


def _canonical(a: np.ndarray, b: np.ndarray) -> dict:
    """Edges as (hi, lo) with hi > lo, self-loops dropped."""
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    keep = hi != lo
    return {"hi": hi[keep].astype(np.int64), "lo": lo[keep].astype(np.int64)}


def large_star(batch: dict) -> dict:
    """One partition of large-star; ``batch`` holds every directed edge (u, v) of its nodes u."""
    u, v = _sorted_unique_edges(batch["u"], batch["v"])
    if len(u) == 0:
        return _canonical(u, v)
    starts = _group_starts(u)
    m = np.minimum(np.minimum.reduceat(v, starts), u[starts])  # smallest neighbour or self
    m_row = np.repeat(m, np.diff(np.append(starts, len(u))))
    larger = v > u
    return _canonical(v[larger], m_row[larger])


def small_star(batch: dict) -> dict:
    """One partition of small-star; ``batch`` holds (u, v) for every edge whose larger end is u."""
    u, v = _sorted_unique_edges(batch["u"], batch["v"])
    if len(u) == 0:
        return _canonical(u, v)
    starts = _group_starts(u)
    m = np.minimum.reduceat(v, starts)  # v < u always here, so the smallest of N(u) and u
    m_row = np.repeat(m, np.diff(np.append(starts, len(u))))
    return _canonical(np.concatenate([v, u[starts]]), np.concatenate([m_row, m]))


def _both_directions(batch: dict) -> dict:
    return {"u": np.concatenate([batch["hi"], batch["lo"]]), "v": np.concatenate([batch["lo"], batch["hi"]])}


def _larger_end(batch: dict) -> dict:
    return {"u": batch["hi"], "v": batch["lo"]}


def _checksum(batch: dict) -> dict:
    """Order-independent fingerprint of a partition's edges: count and a hash sum."""
    h = batch["hi"].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ batch["lo"].astype(np.uint64)
    h ^= h >> np.uint64(31)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    total = int(h.sum(dtype=np.uint64)) if len(h) else 0
    return {"n": np.array([len(h)], dtype=np.int64), "h": np.array([str(total)])}


def _shuffled(ds, key: str, num_partitions: int, fn):
    """Hash-partition ``ds`` by ``key`` and apply ``fn`` to each whole partition."""
    return ds.repartition(num_partitions, keys=[key]).map_batches(fn, batch_size=None, batch_format="numpy")


def _fingerprint(ds) -> tuple[int, int]:
    rows = ds.map_batches(_checksum, batch_size=None, batch_format="numpy").take_all()
    return sum(int(r["n"]) for r in rows), sum(int(r["h"]) for r in rows) % (1 << 64)


def connected_components(edges, num_partitions: int):
    """Map every node of ``edges`` (a Dataset with int64 columns ``hi``, ``lo``) to its component.

    Returns a materialised Dataset with columns ``node`` and ``root`` (the component's smallest
    node), one row per node that is not itself a root. Nodes without edges do not appear.
    Each round is two hash shuffles; large-star also drops duplicate edges.
    """
    current, seen = edges, None
    for _ in range(_MAX_ROUNDS):
        step = _shuffled(current.map_batches(_both_directions, batch_format="numpy"), "u", num_partitions, large_star)
        step = _shuffled(step.map_batches(_larger_end, batch_format="numpy"), "u", num_partitions, small_star)
        current = step.materialize()
        # small-star's output multiset depends only on the graph (each node's edges meet in one
        # partition), so equal fingerprints mean a fixed point: one star per component.
        now = _fingerprint(current)
        if now == seen:
            return current.rename_columns({"hi": "node", "lo": "root"})
        seen = now
    raise RuntimeError(f"connected components did not converge in {_MAX_ROUNDS} rounds")
