"""One analysis of a document shared by every rule set: words, lines and paragraphs are split
once, on first use, and each rule set reads what it needs (Doc).

Words: one regex tokenisation close to the spaCy English tokenizer that datatrove's filters use
(punctuation marks are words of their own, ``don't`` is ``do`` + ``n't``, ``...`` is one
word, ``os.path`` stays whole), many times cheaper. Rules that count words (Gopher's word count, its ratios, FineWeb's
newline-per-word ratio) therefore agree with datatrove on most documents but not on all:
docs/benchmarks.md measures the agreement per rule.
"""
from __future__ import annotations

import re
from functools import cached_property

import numpy as np

# Unicode Sentence_Terminal characters, the set datatrove (src/datatrove/utils/text.py,
# Apache-2.0) uses for FineWeb's line-punctuation rule.
TERMINAL_PUNCTUATION = '!.?\u0589\u061d\u061e\u061f\u06d4\u0700\u0701\u0702\u07f9\u0837\u0839\u083d\u083e\u0964\u0965\u104a\u104b\u1362\u1367\u1368\u166e\u1735\u1736\u17d4\u17d5\u17d6\u17d9\u17da\u1803\u1809\u1944\u1945\u1aa8\u1aa9\u1aaa\u1aab\u1b5a\u1b5b\u1b5e\u1b5f\u1b7d\u1b7e\u1c3b\u1c3c\u1c7e\u1c7f\u203c\u203d\u2047\u2048\u2049\u2e2e\u2e3c\u2e53\u2e54\u3002\ua4ff\ua60e\ua60f\ua6f3\ua6f7\ua876\ua877\ua8ce\ua8cf\ua92f\ua9c8\ua9c9\uaa5d\uaa5e\uaa5f\uaaf0\uaaf1\uabeb\ufe52\ufe56\ufe57\uff01\uff0e\uff1f\uff61\U00010a56\U00010a57\U00010f55\U00010f56\U00010f57\U00010f58\U00010f59\U00010f86\U00010f87\U00010f88\U00010f89\U00011047\U00011048\U000110be\U000110bf\U000110c0\U000110c1\U00011141\U00011142\U00011143\U000111c5\U000111c6\U000111cd\U000111de\U000111df\U00011238\U00011239\U0001123b\U0001123c\U000112a9\U0001144b\U0001144c\U000115c2\U000115c3\U000115c9\U000115ca\U000115cb\U000115cc\U000115cd\U000115ce\U000115cf\U000115d0\U000115d1\U000115d2\U000115d3\U000115d4\U000115d5\U000115d6\U000115d7\U00011641\U00011642\U0001173c\U0001173d\U0001173e\U00011944\U00011946\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41\U00011c42\U00011ef7\U00011ef8\U00011f43\U00011f44\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44\U00016e98\U0001bc9f\U0001da88'

# spaCy-like words: abbreviations (e.g.), can|not, do|n't, it|'s, \\n, -1 and -2.5 whole; a word
# runs from a letter or digit to a letter or digit over any non-space except quotes, = and the
# infixes spaCy splits (a hyphen before a letter, a slash not between digits): os.path, 3.14,
# 1-2 and 3/4 stay whole, well-known is well|-|known; "...", '', "):", runs of "--" and each
# other mark alone. docs/benchmarks.md measures the agreement this gives with spaCy's counts.
_WORD = re.compile(r"(?:[^\W\d_]\.){2,}|\bcan(?=not\b)|[^\W_]+(?=n['’]t\b)|n['’]t\b|['’](?:s|re|ve|ll|d|m)\b"
                   r"|\\\w+|-\d+(?:\.\d+)?"
                   r"|[^\W_](?:(?:[^\s'’\-/=]|-(?![^\W\d_])|(?<=\d)/(?=\d))*[^\W_])?"
                   r"|\.\.\.|--+|''|\):|[^\w\s]|_", re.IGNORECASE)
_ALPHA = re.compile(r"[^\W\d_]")  # a letter
_ALNUM = re.compile(r"[^\W_]")  # a letter or digit: a word that is not a symbol
_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")


def words(text: str) -> list[str]:
    return _WORD.findall(text)


class Doc:
    """A document's text and its splits, each computed once whichever rule asks first."""

    def __init__(self, text: str):
        self.text = text

    @cached_property
    def words(self) -> list[str]:
        return _WORD.findall(self.text)

    @cached_property
    def word_ids(self) -> tuple[np.ndarray, list[str]]:
        """Each word's number (in order of first occurrence) and the distinct words in that order."""
        seen: dict[str, int] = {}
        ids = np.fromiter((seen.setdefault(w, len(seen)) for w in self.words), np.int64, len(self.words))
        return ids, list(seen)

    @cached_property
    def word_lengths(self) -> np.ndarray:
        ids, uniq = self.word_ids
        return np.fromiter(map(len, uniq), np.int64, len(uniq))[ids]

    @cached_property
    def splitlines(self) -> list[str]:
        return self.text.splitlines()

    @cached_property
    def newline_runs(self) -> list[str]:
        """Lines split on runs of \\n (Gopher repetition's lines)."""
        return _LINES.split(self.text)

    @cached_property
    def paragraphs(self) -> list[str]:
        return _PARAGRAPHS.split(self.text.strip())


def find_duplicates(items: list[str]) -> tuple[int, int]:
    """(elements equal to an earlier one, their characters), as Gopher counts duplicates."""
    seen: set[str] = set()
    n = chars = 0
    for x in items:
        if x in seen:
            n += 1
            chars += len(x)
        else:
            seen.add(x)
    return n, chars


def has_alpha(word: str) -> bool:
    return _ALPHA.search(word) is not None


def has_alnum(word: str) -> bool:
    return _ALNUM.search(word) is not None
