"""The ``fuzzy_dedup`` section of a prepare job (docs/fuzzy-dedup.md)."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from gristmill.config import Bool, Float, Int, NonNegativeInt, PositiveInt, Section, fail

from .lsh import MISS_RATE, LSHParams, make_params, optimal_params, recall_params


class FuzzyDedupConfig(Section):
    """The ``fuzzy_dedup`` stage (its tasks.py, docs/fuzzy-dedup.md)."""

    SECTION = "fuzzy_dedup"
    enabled: Bool = True
    ngram: PositiveInt = 5  # words per shingle, after pipeline.text normalisation
    num_perm: PositiveInt = 128
    seed: Int = 1  # permutation seed, as datasketch.MinHash(seed=...)
    threshold: Annotated[Float, Field(gt=0, lt=1)] = 0.8  # Jaccard at or above which two documents are near-duplicates
    bands: PositiveInt | None = None  # bands x rows; None: chosen (lsh.recall_params, or the weights search unverified)
    rows: PositiveInt | None = None
    miss_rate: Annotated[Float, Field(gt=0, lt=1)] = MISS_RATE  # verify: true: the most often a pair at the threshold
    # may share no band; the fewest false candidates within it (verification keeps precision)
    false_positive_weight: Float = 0.1  # verify: false: datasketch MinHashLSH `weights` (every candidate is then a merge)
    false_negative_weight: Float = 0.9
    verify: Bool = True  # exact Jaccard on shingles for every candidate pair
    batch_size: PositiveInt = 1024  # documents per signature batch
    sample_pairs: NonNegativeInt = 20  # removed pairs quoted in the report

    @model_validator(mode="after")
    def _bands_rows(self) -> "FuzzyDedupConfig":
        if (self.bands is None) != (self.rows is None):
            fail("both bands and rows or neither", f"bands={self.bands!r}, rows={self.rows!r}")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            fail(f"bands x rows to fit in num_perm={self.num_perm}",
                 f"bands x rows = {self.bands} x {self.rows} = {self.bands * self.rows}")
        return self

    def lsh(self) -> LSHParams:
        if self.bands is not None:
            return make_params(self.threshold, self.num_perm, self.bands, self.rows)
        if self.verify:
            return recall_params(self.threshold, self.num_perm, self.miss_rate)
        return optimal_params(self.threshold, self.num_perm, self.false_positive_weight, self.false_negative_weight)
