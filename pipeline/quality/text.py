"""One analysis of a document shared by every rule set: words, lines and paragraphs are split
once, on first use, and each rule set reads what it needs (Doc).

Words: one regex tokenisation close to the spaCy English tokenizer that datatrove's filters use
(punctuation marks are words of their own, ``don't`` is ``do`` + ``n't``, ``...`` is one
word, ``os.path`` stays whole), many times cheaper. Rules that count words (Gopher's word count, its ratios, FineWeb's
newline-per-word ratio) therefore agree with datatrove on most documents but not on all:
docs/benchmarks.md measures the agreement per rule. The rules read them from ``analyse``: the regex's
words, found by a numba scanner on ASCII tokens and by the regex on the others.
"""
from __future__ import annotations

import re
from functools import cached_property
from itertools import chain, compress, count, repeat
from operator import is_, not_
from typing import NamedTuple

import numpy as np

from gristmill.jit import cached_njit

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
    def words(self) -> "Words":
        """``words(text)`` as arrays (``analyse``): each word's hash, length and kind; its length is the word count."""
        return analyse(self.text)

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


class Words(NamedTuple):
    """A text's words (those of ``words(text)``, in order) as arrays the numba kernels read: each word's
    64-bit hash (of its UTF-8 bytes: equal words, equal hashes; two different words of a document share
    one with probability ~n^2 / 2^64, as the n-gram hashes already do), length in characters and kind
    (``has_alnum | has_alpha << 1``)."""

    hashes: np.ndarray  # uint64
    lengths: np.ndarray  # int64
    kinds: np.ndarray  # int8


def analyse(text: str) -> Words:
    """``Words`` of ``text``. numba splits its UTF-8 bytes at ``str.split``'s white space and each ASCII
    token into ``_WORD``'s words (``_ascii_match``: the regex's alternatives, in its order), hashing and
    measuring them as it goes; only tokens with a non-ASCII character are Python's (``token_words``), each
    split once a process and kept (``TOKENS``). tests/test_quality.py checks the words against the regex's."""
    raw = text.encode("utf-8", "surrogatepass")
    buf = np.frombuffer(raw, np.uint8)
    starts, ends, kinds = _tokens(buf)
    other = np.flatnonzero(kinds == _OTHER)
    rows, counts = TOKENS.rows([raw[s:e] for s, e in zip(starts[other].tolist(), ends[other].tolist())])
    # contiguous columns: one signature a kernel (another would be compiled in every worker)
    hashes, lengths, word_kinds = _emit(buf, starts, ends, kinds, rows[:, 0].view(np.uint64).copy(), rows[:, 1].copy(),
                                        rows[:, 2].astype(np.int8), counts)
    return Words(hashes, lengths, word_kinds)


def word_hashes(words: list[str]) -> np.ndarray:
    """The hash ``analyse`` gives each word (uint64), for words Python holds (stop words, the words of
    ``token_words``): the same function of the same bytes, in one call."""
    raw = [w.encode("utf-8", "surrogatepass") for w in words]
    ends = np.cumsum(np.fromiter(map(len, raw), np.int64, len(raw)))
    starts = np.concatenate(([0], ends[:-1])) if len(raw) else ends
    return _hash_spans(np.frombuffer(b"".join(raw), np.uint8), starts, ends)


class Tokens:
    """The white-space tokens ``analyse`` leaves to Python that a process has met, each with its words'
    (hash, length, kind) rows as int64 bytes (a document's are one ``b"".join``; the GC never walks them).
    About 80% of such tokens repeat an earlier one. At ``MAX`` tokens it starts over, between two texts."""

    MAX = 1 << 19  # tokens remembered (~150 MB at most, with their rows)

    def __init__(self):
        self.known: dict[bytes, bytes] = {}

    def rows(self, toks: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """The (hash, length, kind) rows of the words of ``toks`` (UTF-8 tokens), in order, and each token's word count."""
        if len(self.known) > self.MAX:
            self.known.clear()
        parts = list(map(self.known.get, toks))
        if None in parts:
            self._add(list(dict.fromkeys(compress(toks, map(is_, parts, repeat(None))))))
            parts = list(map(self.known.__getitem__, toks))
        counts = np.fromiter(map(len, parts), np.int64, len(parts)) // 24
        return np.frombuffer(b"".join(parts), np.int64).reshape(-1, 3), counts

    def _add(self, new: list[bytes]) -> None:
        split = [token_words(t.decode("utf-8", "surrogatepass")) for t in new]
        flat = list(chain.from_iterable(split))
        rows = np.empty((len(flat), 3), np.int64)
        rows[:, 0] = word_hashes(flat).view(np.int64)
        rows[:, 1] = np.fromiter(map(len, flat), np.int64, len(flat))
        rows[:, 2] = [(_ALNUM.search(w) is not None) | (_ALPHA.search(w) is not None) << 1 for w in flat]
        end = 0
        for tok, ws in zip(new, split):
            start, end = end, end + len(ws)
            self.known[tok] = rows[start:end].tobytes()


TOKENS = Tokens()  # one a process: its documents share it

_ASCII, _OTHER = 0, 1  # a token's kind in _tokens: ASCII (_ascii_words splits it), or Python's to split


@cached_njit()
def _space(buf, i):
    """The byte length of the white space ``str.split`` splits at starting at ``buf[i]`` (UTF-8), else 0:
    ASCII's \t-\r, \x1c-\x1f and space, and U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029,
    U+202F, U+205F and U+3000 (tests/test_quality.py checks every code point)."""
    b = buf[i]
    if b == 32 or 9 <= b <= 13 or 28 <= b <= 31:
        return 1
    if b < 0x80:
        return 0
    n = buf.shape[0]
    if b == 0xC2:
        return 2 if i + 1 < n and (buf[i + 1] == 0x85 or buf[i + 1] == 0xA0) else 0
    if i + 2 >= n or b < 0xE1 or b > 0xE3:
        return 0
    b1, b2 = buf[i + 1], buf[i + 2]
    if b == 0xE1:
        return 3 if b1 == 0x9A and b2 == 0x80 else 0
    if b == 0xE3:
        return 3 if b1 == 0x80 and b2 == 0x80 else 0
    if b1 == 0x80 and (0x80 <= b2 <= 0x8A or b2 == 0xA8 or b2 == 0xA9 or b2 == 0xAF):
        return 3
    return 3 if b1 == 0x81 and b2 == 0x9F else 0


@cached_njit()
def _tokens(buf):
    """The white-space tokens of UTF-8 ``buf``: starts, ends and kinds (``_ASCII`` or ``_OTHER``)."""
    n = buf.shape[0]
    starts = np.empty(n // 2 + 1, np.int64)
    ends = np.empty(n // 2 + 1, np.int64)
    kinds = np.empty(n // 2 + 1, np.int8)
    k = 0
    i = 0
    while i < n:
        w = _space(buf, i)
        if w:
            i += w
            continue
        s = i
        kind = _ASCII
        while i < n:
            if buf[i] < 0x80:
                if buf[i] == 32 or 9 <= buf[i] <= 13 or 28 <= buf[i] <= 31:
                    break
            elif _space(buf, i):
                break
            else:
                kind = _OTHER
            i += 1
        starts[k], ends[k], kinds[k] = s, i, kind
        k += 1
    return starts[:k], ends[:k], kinds[:k]


@cached_njit()
def _letter(c):
    return 65 <= c <= 90 or 97 <= c <= 122


@cached_njit()
def _digit(c):
    return 48 <= c <= 57


@cached_njit()
def _wordchar(c):  # \w
    return _letter(c) or _digit(c) or c == 95


@cached_njit()
def _ascii_match(buf, s, e, p):
    """The end of ``_WORD``'s match at ``p`` in the ASCII token ``buf[s:e]`` (white space or the text's ends
    around it), its alternatives tried in their order as the regex does; -1 where none matches (none: every
    ASCII character is a word or a mark). tests/test_quality.py checks it against the regex on random tokens."""
    c = buf[p]
    lo = c | 32  # ASCII letters to lower case (no other byte becomes a letter)
    if _letter(c):  # (?:[^\W\d_]\.){2,}
        q = p
        while q + 1 < e and _letter(buf[q]) and buf[q + 1] == 46:
            q += 2
        if q - p >= 4:
            return q
    if lo == 99 and p + 6 <= e and (p == s or not _wordchar(buf[p - 1])) and (buf[p + 1] | 32) == 97 \
            and (buf[p + 2] | 32) == 110 and (buf[p + 3] | 32) == 110 and (buf[p + 4] | 32) == 111 \
            and (buf[p + 5] | 32) == 116 and (p + 6 == e or not _wordchar(buf[p + 6])):
        return p + 3  # \bcan(?=not\b)
    if _letter(c) or _digit(c):  # [^\W_]+(?=n['’]t\b): the run's last letter is the n
        r = p
        while r < e and (_letter(buf[r]) or _digit(buf[r])):
            r += 1
        if r - p >= 2 and (buf[r - 1] | 32) == 110 and r + 1 < e and buf[r] == 39 and (buf[r + 1] | 32) == 116 \
                and (r + 2 == e or not _wordchar(buf[r + 2])):
            return r - 1
    if lo == 110 and p + 2 < e and buf[p + 1] == 39 and (buf[p + 2] | 32) == 116 \
            and (p + 3 == e or not _wordchar(buf[p + 3])):
        return p + 3  # n['’]t\b
    if c == 39 and p + 1 < e:  # ['’](?:s|re|ve|ll|d|m)\b
        c1 = buf[p + 1] | 32
        c2 = buf[p + 2] | 32 if p + 2 < e else 0
        n = 0
        if c1 == 115 or c1 == 100 or c1 == 109:
            n = 1
        elif (c1 == 114 and c2 == 101) or (c1 == 118 and c2 == 101) or (c1 == 108 and c2 == 108):
            n = 2
        if n and (p + 1 + n == e or not _wordchar(buf[p + 1 + n])):
            return p + 1 + n
    if c == 92 and p + 1 < e and _wordchar(buf[p + 1]):  # \\\w+
        q = p + 1
        while q < e and _wordchar(buf[q]):
            q += 1
        return q
    if c == 45 and p + 1 < e and _digit(buf[p + 1]):  # -\d+(?:\.\d+)?
        q = p + 1
        while q < e and _digit(buf[q]):
            q += 1
        if q + 1 < e and buf[q] == 46 and _digit(buf[q + 1]):
            q += 1
            while q < e and _digit(buf[q]):
                q += 1
        return q
    if _letter(c) or _digit(c):  # a letter or digit, on to the last letter or digit of the run the word may cross
        last = p
        q = p + 1
        while q < e:
            b = buf[q]
            if b == 39 or b == 61:  # ' =
                break
            if b == 45:  # - not before a letter
                if q + 1 < e and _letter(buf[q + 1]):
                    break
            elif b == 47:  # / between digits
                if not (_digit(buf[q - 1]) and q + 1 < e and _digit(buf[q + 1])):
                    break
            elif _letter(b) or _digit(b):
                last = q
            q += 1
        return last + 1
    if c == 46 and p + 2 < e and buf[p + 1] == 46 and buf[p + 2] == 46:  # \.\.\.
        return p + 3
    if c == 45 and p + 1 < e and buf[p + 1] == 45:  # --+
        q = p + 2
        while q < e and buf[q] == 45:
            q += 1
        return q
    if (c == 39 and p + 1 < e and buf[p + 1] == 39) or (c == 41 and p + 1 < e and buf[p + 1] == 58):  # '' ):
        return p + 2
    if not _wordchar(c) or c == 95:  # [^\w\s]|_
        return p + 1
    return -1


@cached_njit()
def _hash(buf, s, e):
    """A word's hash: FNV-1a of its bytes and length, then splitmix64's finaliser (every bit mixed)."""
    h = np.uint64(0xCBF29CE484222325)
    for i in range(s, e):
        h = (h ^ np.uint64(buf[i])) * np.uint64(0x100000001B3)
    x = h ^ np.uint64(e - s)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@cached_njit()
def _hash_spans(buf, starts, ends):
    out = np.empty(starts.shape[0], np.uint64)
    for i in range(starts.shape[0]):
        out[i] = _hash(buf, starts[i], ends[i])
    return out


@cached_njit()
def _emit(buf, starts, ends, kinds, other_hashes, other_lengths, other_kinds, other_counts):
    """The words of the tokens of ``_tokens``, in order: each ``_ASCII`` token's by ``_ascii_match``, each
    ``_OTHER`` token's (its ``other_counts`` words, in turn) from Python's rows."""
    m = other_hashes.shape[0]
    for t in range(kinds.shape[0]):
        if kinds[t] == _ASCII:
            m += ends[t] - starts[t]  # at most a word a byte
    hashes = np.empty(m, np.uint64)
    lengths = np.empty(m, np.int64)
    out_kinds = np.empty(m, np.int8)
    w = r = j = 0
    for t in range(kinds.shape[0]):
        if kinds[t] == _OTHER:
            for _ in range(other_counts[j]):
                hashes[w], lengths[w], out_kinds[w] = other_hashes[r], other_lengths[r], other_kinds[r]
                w += 1
                r += 1
            j += 1
            continue
        s, e = starts[t], ends[t]
        p = s
        while p < e:
            q = _ascii_match(buf, s, e, p)
            if q < 0:
                p += 1
                continue
            kind = 0
            for i in range(p, q):
                if _letter(buf[i]):
                    kind = 3
                    break
                if _digit(buf[i]):
                    kind = 1
            hashes[w], lengths[w], out_kinds[w] = _hash(buf, p, q), q - p, kind
            w += 1
            p = q
    return hashes[:w], lengths[:w], out_kinds[:w]
