"""C4's cleaning rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", section 2.2; the reference code is tensorflow_datasets'
``c4_utils.py``), in the order and with the semantics of datatrove's C4QualityFilter.

C4 is a line filter: it keeps only lines ending in terminal punctuation with at least three
words, drops javascript and policy lines, and then judges the document on what is left
(any "lorem ipsum" or "{" in a kept line, fewer than five sentences). With ``drop_lines`` (the
default, as in C4) a kept document that lost a line (or a citation) has its kept lines as its
new text: the quality stage writes it to ``overrides/quality/``, and FineWeb's rules read that
output (its kept lines joined by newlines, as in datatrove). With ``drop_lines: false`` the
text is left alone, only the document rules apply, and FineWeb reads the original text. Sentences are counted with a regex (a terminal mark followed by space
and more text ends a sentence) where datatrove runs spaCy's sentencizer.
"""
from __future__ import annotations

import re

from .rules import Rule, flag, ratio
from .text import Doc

SET = "c4"
CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
END_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*\s+(?=\S)")

RULES = [
    Rule(f"{SET}:lorem_ipsum", high=lambda c: flag(c.filter_lorem_ipsum)),
    Rule(f"{SET}:curly_bracket", high=lambda c: flag(c.filter_curly_bracket)),
    Rule(f"{SET}:sentences", low=lambda c: c.min_num_sentences),
    Rule(f"{SET}:empty", high=lambda c: 0 if c.drop_lines else None),  # no line kept: nothing left to train on
]
INFO = [f"{SET}:dropped_lines"]  # fraction of lines dropped (a metric, not a rule)


def measure(doc: Doc, cfg) -> tuple[dict[str, float], str, bool]:
    """The metrics, the kept lines' text (C4's output, one line each) and whether a line with
    text was dropped or cut (if not, only blank lines and indentation differ: the stage keeps
    the original text, paragraph breaks included)."""
    kept: list[str] = []
    lorem = curly = sentences = 0
    lines = doc.splitlines
    content = 0  # lines with text: a document that keeps all of them, unchanged, keeps its text as it is
    for line in lines:
        line = line.strip()
        content += bool(line)
        original = line
        words = line.split()
        if cfg.max_word_length is not None and any(len(w) > cfg.max_word_length for w in words):
            continue
        if cfg.remove_citations:
            line = CITATION.sub("", line)
        if cfg.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith("...")):
            continue
        if cfg.min_words_per_line is not None and len(words) < cfg.min_words_per_line:
            continue
        low = line.lower()
        if cfg.filter_lorem_ipsum and "lorem ipsum" in low:
            lorem += 1
            continue
        if cfg.filter_javascript and "javascript" in low:
            continue
        if cfg.filter_curly_bracket and "{" in line:
            curly += 1
            continue
        if cfg.filter_policy and any(p in low for p in POLICY):
            continue
        sentences += 1 + len(_SENTENCE_END.findall(line))
        kept.append(line)
        content -= line == original
    text = "\n".join(kept).strip()
    return ({f"{SET}:lorem_ipsum": float(lorem), f"{SET}:curly_bracket": float(curly), f"{SET}:sentences": float(sentences),
             f"{SET}:empty": float(not text), f"{SET}:dropped_lines": ratio(len(lines) - len(kept), len(lines))},
            text, content > 0)
