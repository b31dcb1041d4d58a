"""Runs of equal values in sorted arrays: the one helper every part uses (grouping sorted keys,
keeping the first of each group, deduplicating sorted pairs)."""
from __future__ import annotations

import numpy as np


def run_starts(*keys: np.ndarray) -> np.ndarray:
    """A boolean mask: True where a run of equal rows starts, for arrays sorted together (a row is
    the i-th value of every key; two rows are equal when every key is). ``np.flatnonzero`` of it
    gives the start indices."""
    n = len(keys[0])
    first = np.zeros(n, dtype=bool)
    if n:
        first[0] = True
        for k in keys:
            first[1:] |= np.asarray(k[1:] != k[:-1], dtype=bool)
    return first
