"""Histograms on fixed bins, so counts add up file by file: a figure never needs every value in memory."""
from __future__ import annotations

import numpy as np

# Sizes (bytes, tokens): four bins per power of two, 1 to 2**40.
LOG_EDGES = np.unique(np.round(2.0 ** np.arange(0, 40.25, 0.25)))
UNIT_EDGES = np.linspace(0.0, 1.0, 41)  # scores in [0, 1]


class Histogram:
    def __init__(self, edges: np.ndarray):
        self.edges = edges
        self.counts = np.zeros(len(edges) - 1, dtype=np.int64)
        self.n = 0
        self.total = 0.0

    def add(self, values) -> "Histogram":
        v = np.asarray(values, dtype=np.float64)
        v = v[~np.isnan(v)]
        # the last bin is closed on the right (numpy's rule): a score of exactly 1.0 counts
        self.counts += np.histogram(np.clip(v, self.edges[0], self.edges[-1]), self.edges)[0]
        self.n += len(v)
        self.total += float(v.sum())
        return self

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0


def shown(*hists: Histogram) -> tuple[np.ndarray, list[np.ndarray]]:
    """The edges and counts of the bins from the first to the last non-empty one of any of them."""
    nz = np.flatnonzero(np.sum([h.counts for h in hists], axis=0))
    lo, hi = (int(nz[0]), int(nz[-1]) + 1) if len(nz) else (0, 1)
    return hists[0].edges[lo:hi + 1], [h.counts[lo:hi] for h in hists]
