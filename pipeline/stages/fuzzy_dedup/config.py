"""This stage's section: ``FuzzyDedupConfig`` lives at the pipeline level (fuzzy_config.py): fuzzy dedup, dedup index and dedup against read it."""
from ...fuzzy_config import FuzzyDedupConfig  # noqa: F401
