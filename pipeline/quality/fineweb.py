"""FineWeb's own heuristics (Penedo et al. 2024, "The FineWeb Datasets: Decanting the Web for
the Finest Text Data at Scale", section 3.3), as datatrove's FineWebQualityFilter computes them.
They run on the text as C4 left it when C4 drops lines (datatrove's FineWeb pipeline order).
"""
from __future__ import annotations

from .rules import Rule, ratio
from .text import TERMINAL_PUNCTUATION, find_duplicates

SET = "fineweb"
_STOP_CHARS = tuple(TERMINAL_PUNCTUATION)

RULES = [
    Rule(f"{SET}:line_punct_ratio", low=lambda c: c.line_punct_thr,
         exempt=lambda v, c: v == 0 and c.line_punct_exclude_zero),
    Rule(f"{SET}:short_line_ratio", high=lambda c: c.short_line_thr),
    Rule(f"{SET}:char_dup_ratio", high=lambda c: c.char_duplicates_ratio),
    Rule(f"{SET}:list_ratio", high=lambda c: c.new_line_ratio),
]


def measure(text: str, n_words: int, cfg) -> dict[str, float]:
    lines = [line for line in text.split("\n") if line.strip() != ""]
    punct = ratio(sum(line.endswith(_STOP_CHARS) for line in lines), len(lines))
    return {f"{SET}:line_punct_ratio": punct,
            f"{SET}:short_line_ratio": ratio(sum(len(line) <= cfg.short_line_length for line in lines), len(lines)),
            f"{SET}:char_dup_ratio": ratio(find_duplicates(lines)[1], len(text) - text.count("\n")),
            f"{SET}:list_ratio": ratio(text.count("\n"), n_words)}
