"""Text normalisation shared by exact dedup, fuzzy dedup, decontamination and the audit.

One implementation, so "the same text" means the same thing in every stage: Unicode NFKC,
case-folded, punctuation removed, whitespace collapsed. This module must not import Ray.
"""
from __future__ import annotations

import re
import unicodedata

_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalize(text: str) -> str:
    """NFKC + casefold + punctuation to spaces + single spaces, stripped."""
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def words(text: str) -> list[str]:
    """The normalised word sequence of ``text``."""
    return normalize(text).split()
