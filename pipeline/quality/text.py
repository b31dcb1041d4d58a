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
from itertools import chain, compress, count, repeat
from operator import is_, not_

import numpy as np

# Unicode Sentence_Terminal characters, the set datatrove (src/datatrove/utils/text.py,
# Apache-2.0) uses for FineWeb's line-punctuation rule.
TERMINAL_PUNCTUATION = '!.?\u0589\u061d\u061e\u061f\u06d4\u0700\u0701\u0702\u07f9\u0837\u0839\u083d\u083e\u0964\u0965\u104a\u104b\u1362\u1367\u1368\u166e\u1735\u1736\u17d4\u17d5\u17d6\u17d9\u17da\u1803\u1809\u1944\u1945\u1aa8\u1aa9\u1aaa\u1aab\u1b5a\u1b5b\u1b5e\u1b5f\u1b7d\u1b7e\u1c3b\u1c3c\u1c7e\u1c7f\u203c\u203d\u2047\u2048\u2049\u2e2e\u2e3c\u2e53\u2e54\u3002\ua4ff\ua60e\ua60f\ua6f3\ua6f7\ua876\ua877\ua8ce\ua8cf\ua92f\ua9c8\ua9c9\uaa5d\uaa5e\uaa5f\uaaf0\uaaf1\uabeb\ufe52\ufe56\ufe57\uff01\uff0e\uff1f\uff61\U00010a56\U00010a57\U00010f55\U00010f56\U00010f57\U00010f58\U00010f59\U00010f86\U00010f87\U00010f88\U00010f89\U00011047\U00011048\U000110be\U000110bf\U000110c0\U000110c1\U00011141\U00011142\U00011143\U000111c5\U000111c6\U000111cd\U000111de\U000111df\U00011238\U00011239\U0001123b\U0001123c\U000112a9\U0001144b\U0001144c\U000115c2\U000115c3\U000115c9\U000115ca\U000115cb\U000115cc\U000115cd\U000115ce\U000115cf\U000115d0\U000115d1\U000115d2\U000115d3\U000115d4\U000115d5\U000115d6\U000115d7\U00011641\U00011642\U0001173c\U0001173d\U0001173e\U00011944\U00011946\U00011a42\U00011a43\U00011a9b\U00011a9c\U00011c41\U00011c42\U00011ef7\U00011ef8\U00011f43\U00011f44\U00016a6e\U00016a6f\U00016af5\U00016b37\U00016b38\U00016b44\U00016e98\U0001bc9f\U0001da88'

# spaCy-like words: abbreviations (e.g.), can|not, do|n't, it|'s, \\n, -1 and -2.5 whole; a word
# runs from a letter or digit to a letter or digit over any non-space except quotes, = and the
# infixes spaCy splits (a hyphen before a letter, a slash not between digits): os.path, 3.14,
# 1-2 and 3/4 stay whole, well-known is well|-|known; "...", '', "):", runs of "--" and each
# other mark alone. docs/benchmarks.md measures the agreement this gives with spaCy's counts.
_ALTERNATIVES = (r"(?:[^\W\d_]\.){2,}", r"\bcan(?=not\b)", r"[^\W_]+(?=n['’]t\b)", r"n['’]t\b", r"['’](?:s|re|ve|ll|d|m)\b",
                 r"\\\w+", r"-\d+(?:\.\d+)?", r"[^\W_](?:(?:[^\s'’\-/=]|-(?![^\W\d_])|(?<=\d)/(?=\d))*[^\W_])?",
                 r"\.\.\.|--+|''|\):|[^\w\s]|_")
_WORD = re.compile("|".join(_ALTERNATIVES), re.IGNORECASE)
# A mark _WORD takes alone at the end of a token (none starts a longer alternative there: "...", "--",
# "''" and "):" need a second mark, "n't" a quote).
_TRAILING = frozenset(',.;:!?)"')
_CANNOT = re.compile("cannot", re.IGNORECASE)
_ALPHA = re.compile(r"[^\W\d_]")  # a letter
_ALNUM = re.compile(r"[^\W_]")  # a letter or digit: a word that is not a symbol
_PARAGRAPHS = re.compile(r"\n{2,}")
_LINES = re.compile(r"\n+")


def words(text: str) -> list[str]:
    """``_WORD.findall(text)``, most tokens without the regex. No alternative matches or crosses white
    space (``\\s`` is ``str.split``'s white space), and every look-around reads only the token or sees
    white space as the text's ends do, so a text's words are its white-space tokens' words. In a text
    without "cannot" (can + not, any case: then the regex on all of it), a token of letters and digits
    only ([^\\W_] is ``str.isalnum``) is one word, and one followed by a mark of ``_TRAILING`` two;
    only the other tokens go to the regex. About half the regex's cost on prose
    (tests/test_quality.py checks it against the regex)."""
    if _CANNOT.search(text):
        return _WORD.findall(text)
    toks = text.split()
    out: list[str] = []
    prev = 0
    for i in compress(count(), map(not_, map(str.isalnum, toks))):  # the tokens that are not one word
        out += toks[prev:i]
        out += token_words(toks[i])
        prev = i + 1
    out += toks[prev:]
    return out


def token_words(tok: str) -> list[str]:
    """The words of one white-space token: itself when it is letters and digits, a word and its trailing
    mark of ``_TRAILING``, else (and always with "cannot" in it: can + not) the regex's."""
    if _CANNOT.search(tok):
        return _WORD.findall(tok)
    if tok.isalnum():
        return [tok]
    if tok[-1] in _TRAILING and tok[:-1].isalnum():
        return [tok[:-1], tok[-1]]
    return _WORD.findall(tok)


class Doc:
    """A document's text and its splits, each computed once whichever rule asks first."""

    def __init__(self, text: str):
        self.text = text

    @cached_property
    def word_ids(self) -> np.ndarray:
        """The number of each of ``words(text)`` in the process's vocabulary (``VOCAB``): equal words,
        equal numbers; its length is the word count."""
        return VOCAB.text_ids(self.text)

    @cached_property
    def splitlines(self) -> list[str]:
        return self.text.splitlines()

    @cached_property
    def newline_runs(self) -> list[str]:
        """Lines split on runs of \\n (Gopher repetition's lines): ``_LINES.split``, as str.split's
        pieces less the empty ones a run leaves inside (an empty first or last piece stays)."""
        parts = self.text.split("\n")
        if "\n\n" not in self.text:
            return parts
        return [p for i, p in enumerate(parts) if p or i == 0 or i == len(parts) - 1]

    @cached_property
    def paragraphs(self) -> list[str]:
        """``_PARAGRAPHS.split`` of the stripped text; str.split where no run is longer than two."""
        text = self.text.strip()
        return text.split("\n\n") if "\n\n\n" not in text else _PARAGRAPHS.split(text)


def find_duplicates(items: list[str]) -> tuple[int, int]:
    """(elements equal to an earlier one, their characters), as Gopher counts duplicates: all of them
    less the first of each, counted in C."""
    first = set(items)
    return len(items) - len(first), sum(map(len, items)) - sum(map(len, first))


def has_alpha(word: str) -> bool:
    return _ALPHA.search(word) is not None


def has_alnum(word: str) -> bool:
    return _ALNUM.search(word) is not None


class Vocabulary:
    """The words and white-space tokens a process has met: each word numbered in order of first meeting,
    with its length and kind (``has_alnum | has_alpha << 1``) in arrays the numba kernels index by
    number, and each token's word numbers. A document then costs a dict lookup a token, in C, instead of
    splitting its tokens into words (the regex on code and paths), numbering its own distinct words and
    measuring and classifying them again: most of a document's tokens are common ones. At ``MAX``
    words or tokens it starts over."""

    MAX = 1 << 19  # distinct words, and tokens, remembered (~200 MB at most; past it, at the next text)

    def __init__(self):
        self.number: dict[str, int] = {}
        self.tokens: dict[str, bytes] = {}  # int64 numbers: bytes join in C and are no work for the GC
        self.lengths = np.zeros(1 << 12, np.int64)
        self.kinds = np.zeros(1 << 12, np.int8)

    def text_ids(self, text: str) -> np.ndarray:
        """The numbers of ``words(text)`` (int64): its tokens' numbers, joined, numbering new tokens first."""
        if len(self.number) > self.MAX or len(self.tokens) > self.MAX:  # between texts: one text's numbers agree
            self.number.clear()
            self.tokens.clear()
        toks = text.split()
        parts = list(map(self.tokens.get, toks))
        if None in parts:  # its new tokens' words, numbered in one call
            new = list(dict.fromkeys(compress(toks, map(is_, parts, repeat(None)))))
            split = list(map(token_words, new))
            ids = self.ids(list(chain.from_iterable(split)))
            end = 0
            for tok, ws in zip(new, split):
                start, end = end, end + len(ws)
                self.tokens[tok] = ids[start:end].tobytes()
            parts = list(map(self.tokens.__getitem__, toks))
        return np.frombuffer(b"".join(parts), np.int64)

    def ids(self, words: list[str]) -> np.ndarray:
        """Each word's number (int64), numbering the new ones first."""
        try:
            return np.fromiter(map(self.number.__getitem__, words), np.int64, len(words))
        except KeyError:  # a word met for the first time
            self._add([w for w in dict.fromkeys(words) if w not in self.number])
            return np.fromiter(map(self.number.__getitem__, words), np.int64, len(words))

    def _add(self, new: list[str]) -> None:
        start = len(self.number)
        end = start + len(new)
        if end > self.lengths.shape[0]:
            cap = max(end, 2 * self.lengths.shape[0])
            self.lengths = np.resize(self.lengths, cap)
            self.kinds = np.resize(self.kinds, cap)
        self.number.update(zip(new, range(start, end)))
        self.lengths[start:end] = np.fromiter(map(len, new), np.int64, len(new))
        self.kinds[start:end] = [(_ALNUM.search(w) is not None) | (_ALPHA.search(w) is not None) << 1 for w in new]


VOCAB = Vocabulary()  # one a process: its documents share it
