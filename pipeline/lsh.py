"""LSH banding: choosing bands x rows for a Jaccard threshold, hashing signature bands, and
turning a bucket of band matches into the candidate pairs to verify.

Two parameter choices:

* ``recall_params`` (``verify: true``, the default): every candidate pair is then checked by exact
  Jaccard, so a false candidate costs one set intersection and never a false merge. Recall is bought
  by design: over every ``(b, r)`` with ``b * r <= num_perm`` whose miss rate at the threshold,
  ``(1 - t**r)**b`` (the chance that a pair of Jaccard exactly ``t`` shares no band), is at most
  ``miss_rate``, take the one with the fewest false candidates (smallest FP area below). At
  threshold 0.8, 128 permutations and ``miss_rate`` 0.002: 21 bands x 6 rows (a pair at J = 0.8
  is missed with probability 0.0017, at J = 0.85 with 5e-5; 14 x 9 misses 13% and 2.5%).
* ``optimal_params`` (``verify: false``): datasketch's ``MinHashLSH`` search
  (``datasketch.lsh._optimal_param``): minimise ``fp_weight * FP + fn_weight * FN``, where FP is the
  area under the collision curve ``1 - (1 - s**r)**b`` below the threshold and FN the area above
  the threshold under its complement, since there every candidate is a merge. datasketch
  integrates with scipy's ``quad``; we use a fixed composite Simpson rule, which agrees to ~1e-12
  and keeps scipy out of the pipeline (tests/test_minhash.py checks we pick the same ``(b, r)``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gristmill.manifests.runs import run_starts

_GRID = 1025  # Simpson points per integral (odd): exact enough for smooth polynomials of degree <= 256


@dataclass(frozen=True)
class LSHParams:
    bands: int
    rows: int
    num_perm: int
    threshold: float
    false_positive: float  # area under the collision curve below the threshold (datasketch's FP)
    false_negative: float  # area above the threshold under 1 - collision probability (datasketch's FN)
    design: str = "given"  # "recall" (recall_params), "weights" (optimal_params) or "given" (make_params)

    @property
    def miss_rate(self) -> float:
        """Chance that a pair of Jaccard exactly the threshold shares no band (is never a candidate);
        higher similarities are missed less often."""
        return (1.0 - self.threshold**self.rows) ** self.bands

    def collision_probability(self, s: float) -> float:
        """Probability that two documents of Jaccard ``s`` share at least one band."""
        return 1.0 - (1.0 - s**self.rows) ** self.bands

    def to_dict(self) -> dict:
        return {
            "bands": self.bands, "rows": self.rows, "num_perm": self.num_perm, "threshold": self.threshold,
            "false_positive_area": self.false_positive, "false_negative_area": self.false_negative,
            "p_candidate_at_threshold": self.collision_probability(self.threshold),
            "miss_rate_at_threshold": self.miss_rate, "design": self.design,
        }


def _simpson(f, lo: float, hi: float) -> float:
    if hi <= lo:
        return 0.0
    x = np.linspace(lo, hi, _GRID)
    y = f(x)
    h = (hi - lo) / (_GRID - 1)
    return float(h / 3 * (y[0] + y[-1] + 4 * y[1:-1:2].sum() + 2 * y[2:-1:2].sum()))


def false_positive_area(threshold: float, b: int, r: int) -> float:
    return _simpson(lambda s: 1 - (1 - s**r) ** b, 0.0, threshold)


def false_negative_area(threshold: float, b: int, r: int) -> float:
    return _simpson(lambda s: (1 - s**r) ** b, threshold, 1.0)


def optimal_params(threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5) -> LSHParams:
    """The ``(bands, rows)`` datasketch's MinHashLSH would pick for this threshold and num_perm."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold!r}")
    best, best_err = (1, 1), float("inf")
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            err = fp_weight * false_positive_area(threshold, b, r) + fn_weight * false_negative_area(threshold, b, r)
            if err < best_err:
                best, best_err = (b, r), err
    return make_params(threshold, num_perm, *best, design="weights")


MISS_RATE = 0.002  # recall_params' default: at most 1 pair in 500 at exactly the threshold never a candidate


def recall_params(threshold: float, num_perm: int, miss_rate: float = MISS_RATE) -> LSHParams:
    """The ``(bands, rows)`` for verified candidates: the fewest false candidates (smallest FP area)
    among those that miss a pair at the threshold with probability at most ``miss_rate``; if no
    ``b * r <= num_perm`` reaches it, the smallest miss rate (ties: the smaller FP area)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold!r}")
    if not 0.0 < miss_rate < 1.0:
        raise ValueError(f"miss_rate must be in (0, 1), got {miss_rate!r}")
    best, best_key = (1, 1), (2, 0.0)
    for r in range(1, num_perm + 1):
        for b in range(1, num_perm // r + 1):
            miss = (1.0 - threshold**r) ** b
            key = (0, false_positive_area(threshold, b, r)) if miss <= miss_rate else (1, miss)
            if key < best_key:
                best, best_key = (b, r), key
    return make_params(threshold, num_perm, *best, design="recall")


def make_params(threshold: float, num_perm: int, bands: int, rows: int, design: str = "given") -> LSHParams:
    """LSHParams for explicitly chosen bands x rows (they must fit in num_perm)."""
    if bands < 1 or rows < 1 or bands * rows > num_perm:
        raise ValueError(f"bands x rows must be >= 1 and fit in num_perm={num_perm}, got {bands} x {rows}")
    return LSHParams(bands, rows, num_perm, threshold, false_positive_area(threshold, bands, rows),
                     false_negative_area(threshold, bands, rows), design)


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``(docs, bands)`` uint64 hash of each band's ``rows`` signature values (band b uses b*r..b*r+r).

    A 64-bit hash stands in for the band's values themselves: two different bands of the corpus
    collide with probability ~n^2 / 2^64, negligible, and the shuffle key stays one integer.
    """
    sig = np.asarray(sig, dtype=np.uint64)[:, : bands * rows].reshape(len(sig), bands, rows)
    h = np.full(sig.shape[:2], np.uint64(0x9E3779B97F4A7C15), dtype=np.uint64)
    for j in range(rows):
        h = (h ^ sig[:, :, j]) * np.uint64(0x100000001B3)  # FNV-style fold over the band's values
        h ^= h >> np.uint64(29)
    return h


REPRESENTATIVES = 4  # each bucket member is verified against the bucket's 4 earliest members and its predecessor


def bucket_pairs(band: np.ndarray, key: np.ndarray, order: np.ndarray,
                 representatives: int = REPRESENTATIVES) -> tuple[np.ndarray, np.ndarray]:
    """The candidate pairs of a set of band rows, as distinct ``(hi, lo)`` with ``hi > lo``.

    In a ``(band, key)`` bucket of k documents sorted by ``order``, each member is paired with the
    bucket's ``representatives`` earliest members and with the member just before it: at most
    ``(representatives + 1) * k`` pairs per bucket, never k(k-1)/2, so a cluster of 200 copies costs
    a few hundred verifications, not 20,000. With exact verification the edges kept are those at or
    above the threshold and the cluster is their connected component, so a member that is not
    similar to the earliest member (a hard negative came first) still finds its cluster through the
    next representatives or its predecessor. What is given up: a member similar only to a bucket
    member that is neither among the first ``representatives`` nor its predecessor is not paired
    with it in this band (it usually is in another band, or through a chain).
    """
    idx = np.lexsort((order, key, band))
    band, key, order = band[idx], key[idx], order[idx]
    n = len(order)
    new = run_starts(band, key)
    first = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    pos = np.arange(n) - first  # position inside the bucket
    his, los = [], []
    for j in range(representatives):
        m = pos > j
        his.append(order[m])
        los.append(order[first[m] + j])
    m = pos > representatives  # the predecessor of a member at pos <= representatives is a representative already
    his.append(order[m])
    los.append(order[np.flatnonzero(m) - 1])
    hi, lo = np.concatenate(his).astype(np.int64), np.concatenate(los).astype(np.int64)
    if not len(hi):
        return hi, lo
    pairs = np.unique(np.stack([hi, lo], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


# -- exact Jaccard of many candidate pairs at once ---------------------------------------------------
try:  # a merge loop over sorted sets; numpy below gives identical results without numba
    import numba
except ImportError:  # pragma: no cover
    numba = None


def _intersections_loop(values, offsets, a, b, out):
    for k in range(len(a)):
        i, ie = offsets[a[k]], offsets[a[k] + 1]
        j, je = offsets[b[k]], offsets[b[k] + 1]
        n = 0
        while i < ie and j < je:
            x, y = values[i], values[j]
            if x == y:
                n += 1
                i += 1
                j += 1
            elif x < y:
                i += 1
            else:
                j += 1
        out[k] = n


if numba is not None:
    from gristmill.jit import cached_njit

    _intersections_loop = cached_njit(nogil=True)(_intersections_loop)


def pair_jaccard(values: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray,
                 use_numba: bool | None = None) -> np.ndarray:
    """Exact Jaccard of set ``a[k]`` with set ``b[k]`` for every k, the sets given as one array of
    sorted distinct uint64 values per set (set i is ``values[offsets[i]:offsets[i + 1]]``). Two empty
    sets have Jaccard 0 (a document without words resembles nothing)."""
    values = np.ascontiguousarray(values, dtype=np.uint64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    a, b = np.ascontiguousarray(a, dtype=np.int64), np.ascontiguousarray(b, dtype=np.int64)
    inter = np.zeros(len(a), dtype=np.int64)
    if numba is not None and use_numba is not False:
        _intersections_loop(values, offsets, a, b, inter)
    else:
        for k in range(len(a)):
            x, y = values[offsets[a[k]]:offsets[a[k] + 1]], values[offsets[b[k]]:offsets[b[k] + 1]]
            inter[k] = len(np.intersect1d(x, y, assume_unique=True))
    sizes = np.diff(offsets)
    union = sizes[a] + sizes[b] - inter
    return np.where(union > 0, inter / np.maximum(union, 1), 0.0)


BUCKETS = 1 << 16  # band-key buckets (the key's top 16 bits); tasks take contiguous ranges of them, as many as the data needs
BAND_ROWS_PER_TASK = 8_000_000  # ~200 MB of band rows per candidates task at most


def plan_bucket_ranges(band_rows: int) -> list[tuple[int, int]]:
    n = max(1, min(BUCKETS, math.ceil(band_rows / BAND_ROWS_PER_TASK)))
    edges = [round(i * BUCKETS / n) for i in range(n + 1)]
    return [(edges[i], edges[i + 1]) for i in range(n)]
