"""LSH banding: choosing bands x rows for a Jaccard threshold, and hashing signature bands.

Parameter choice is datasketch's ``MinHashLSH`` search (``datasketch.lsh._optimal_param``): over
every ``(b, r)`` with ``b * r <= num_perm``, minimise ``fp_weight * FP + fn_weight * FN``, where
FP is the area under the collision curve ``1 - (1 - s**r)**b`` below the threshold and FN the area
above the threshold under its complement. datasketch integrates with scipy's ``quad``; we use a
fixed composite Simpson rule, which agrees to ~1e-12 and keeps scipy out of the pipeline
(tests/test_minhash.py checks we pick the same ``(b, r)`` as datasketch).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_GRID = 1025  # Simpson points per integral (odd): exact enough for smooth polynomials of degree <= 256


@dataclass(frozen=True)
class LSHParams:
    bands: int
    rows: int
    num_perm: int
    threshold: float
    false_positive: float  # area under the collision curve below the threshold (datasketch's FP)
    false_negative: float  # area above the threshold under 1 - collision probability (datasketch's FN)

    def collision_probability(self, s: float) -> float:
        """Probability that two documents of Jaccard ``s`` share at least one band."""
        return 1.0 - (1.0 - s**self.rows) ** self.bands

    def to_dict(self) -> dict:
        return {
            "bands": self.bands, "rows": self.rows, "num_perm": self.num_perm, "threshold": self.threshold,
            "false_positive_area": self.false_positive, "false_negative_area": self.false_negative,
            "p_candidate_at_threshold": self.collision_probability(self.threshold),
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
    return make_params(threshold, num_perm, *best)


def make_params(threshold: float, num_perm: int, bands: int, rows: int) -> LSHParams:
    """LSHParams for explicitly chosen bands x rows (they must fit in num_perm)."""
    if bands < 1 or rows < 1 or bands * rows > num_perm:
        raise ValueError(f"bands x rows must be >= 1 and fit in num_perm={num_perm}, got {bands} x {rows}")
    return LSHParams(bands, rows, num_perm, threshold, false_positive_area(threshold, bands, rows),
                     false_negative_area(threshold, bands, rows))


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
