"""A rule: a named metric of a document and the thresholds that remove it.

A rule's name (``<rule set>:<metric>``, e.g. ``gopher_quality:word_count``) is at once the
reason a removed document records, the key of its count in the report, and the metric's
column in ``quality/block-B.parquet``. ``low`` and ``high`` read the thresholds from the rule
set's config (``None``: that side is off): a value below ``low`` or above ``high`` removes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Threshold = Callable[[Any], "float | None"]


@dataclass(frozen=True)
class Rule:
    name: str
    low: Threshold | None = None
    high: Threshold | None = None
    exempt: Callable[[float, Any], bool] | None = None  # a value this rule lets pass whatever the thresholds

    def limits(self, cfg) -> tuple["Rule", float | None, float | None]:
        """(this rule, its low and high thresholds under ``cfg``): what ``verdict`` compares with."""
        return self, self.low(cfg) if self.low else None, self.high(cfg) if self.high else None

    def verdict(self, value: float, cfg) -> float | None:
        """The threshold ``value`` crosses under ``cfg``, or None when it passes."""
        if self.exempt is not None and self.exempt(value, cfg):
            return None
        lo = self.low(cfg) if self.low else None
        if lo is not None and value < lo:
            return lo
        hi = self.high(cfg) if self.high else None
        if hi is not None and value > hi:
            return hi
        return None


def flag(on: bool) -> float | None:
    """A yes/no document rule as a threshold: any matching line (a count above 0) removes."""
    return 0 if on else None


def ratio(num: float, den: float) -> float:
    return num / den if den else 0.0
