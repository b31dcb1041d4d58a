"""Vectorised words and word hashes of ``pipeline.text.words``, shared by MinHash and n-gram code.

``pipeline.text.words`` is the project's one text normalisation: NFKC, casefold, then words are
maximal runs of ``str.isalnum`` characters. Fuzzy dedup (``pipeline.minhash``) and eval
decontamination (``pipeline.ngrams``) both need those words for whole batches of texts, hashed,
without a Python loop per word. This module is the single place that does it:

- ``code_points``: a batch of texts as one code-point buffer (+ where each text starts);
- ``word_char_table`` / ``ASCII_WORD`` / ``ASCII_LOWER``: the word-character rule and ASCII case, by table;
- ``mix64`` (and ``mix64_jit`` for numba loops): the one 64-bit finaliser (MurmurHash3 fmix64);
- ``powers``: cached ``base**k mod 2**64``;
- ``word_hashes``: texts -> one uint64 hash per word and per-text word offsets.

A word's hash is ``mix64(poly ^ length)`` with ``poly`` the polynomial hash (base ``P``) of its
(folded, lower-cased) code points, all wrapping uint64 arithmetic: stable across processes,
machines and runs. ``pipeline.minhash``'s numba loop computes the same values with Horner's rule.
Changing anything here changes every hash: bump ``pipeline.ngrams.HASH_VERSION`` if you do, and
clear numba's cache of ``pipeline.minhash._shingle_loops`` (it compiles ``mix64_jit`` and ``P`` in,
and numba does not see changes in another file).

numpy only (numba optional), no Ray: it runs on Ray workers and in the audit alike.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np

from gristmill.jit import cached_njit

try:  # only to compile mix64 for the numba loops that call it; everything here works without
    import numba
except ImportError:  # pragma: no cover
    numba = None

P = 0x100000001B3  # polynomial base of word hashes (the FNV-1a 64-bit prime): odd, so invertible mod 2**64
P_INV = pow(P, -1, 1 << 64)


def mix64(z):
    """MurmurHash3's 64-bit finaliser (fmix64): spreads every input bit over every output bit
    (an avalanching bijection on uint64, wrapping arithmetic).

    Written so the same source works on numpy arrays (vectorised) and, through ``mix64_jit``, on
    uint64 scalars inside numba loops: one definition, so both paths give identical hashes.
    (This is the mixer MinHash always used, so its signatures and the fuzzy-dedup results tuned
    on them are unchanged; n-gram hashes moved to it from splitmix64, hence HASH_VERSION v2.)
    """
    z = (z ^ (z >> np.uint64(33))) * np.uint64(0xFF51AFD7ED558CCD)
    z = (z ^ (z >> np.uint64(33))) * np.uint64(0xC4CEB9FE1A85EC53)
    return z ^ (z >> np.uint64(33))


# mix64 compiled for numba code (numba cannot call the plain Python function from a loop).
mix64_jit = cached_njit(nogil=True)(mix64) if numba is not None else mix64

_powers_cache: dict[int, np.ndarray] = {}


def powers(base: int, size: int) -> np.ndarray:
    """``base**k mod 2**64`` for k < size (cached per process, grown in powers of two so a
    growing batch size does not recompute it every time)."""
    have = _powers_cache.get(base)
    if have is None or len(have) < size:
        length = 1 << max(10, (size - 1).bit_length())
        p = np.full(length, base, dtype=np.uint64)
        p[0] = 1
        have = np.cumprod(p, dtype=np.uint64)  # wraps mod 2**64, deterministically
        _powers_cache[base] = have
    return have[:size]


def _is_word_char(c: int) -> bool:
    r"""The word rule. ``pipeline.text`` splits on the regex ``[\W_]+``, and for every code point
    ``[^\W_]`` matches exactly when ``str.isalnum()`` is true (tests check all of Unicode)."""
    return chr(c).isalnum()


# ASCII tables, built at import (cheap). ASCII text is not lower-cased as a string: the word
# loops lower it by table, which saves a copy of every text on the hot path.
ASCII_WORD = np.array([_is_word_char(c) for c in range(128)], dtype=bool)
ASCII_LOWER = np.array([ord(chr(c).lower()) for c in range(128)], dtype=np.uint32)

_word_char: np.ndarray | None = None


def word_char_table() -> np.ndarray:
    """``table[c]``: code point ``c`` is part of a word, for all of Unicode. Built lazily once per
    process (0.1 s, 1.1 MB), so all-ASCII workloads never pay for it."""
    global _word_char
    if _word_char is None:
        _word_char = np.fromiter((_is_word_char(c) for c in range(0x110000)), dtype=bool, count=0x110000)
    return _word_char


def word_table_for(cps: np.ndarray) -> np.ndarray:
    """The word table to index ``cps`` with: the ASCII one for an all-ASCII (uint8) buffer."""
    return ASCII_WORD if cps.dtype == np.uint8 else word_char_table()


def fold(text: str) -> str:
    """``pipeline.text.normalize`` before its punctuation step: NFKC, then case folding.
    For ASCII text both reduce to ``lower()``."""
    return text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()


def code_points(texts) -> tuple[np.ndarray, np.ndarray]:
    """The code points of all texts, joined by a space (so no word spans two texts), and the index
    where each text starts.

    Non-ASCII texts are folded here (NFKC + casefold); ASCII texts are kept as they are (for them
    NFKC is the identity and casefold is lower-case, done by ``ASCII_LOWER`` by whoever hashes).
    The buffer is uint8 when everything is ASCII (4x less memory to scan), uint32 otherwise;
    lone surrogates survive NFKC, hence ``surrogatepass``.
    """
    prepped = [t if t.isascii() else unicodedata.normalize("NFKC", t).casefold() for t in texts]
    lengths = np.fromiter((len(t) + 1 for t in prepped), dtype=np.int64, count=len(prepped))
    starts = np.zeros(len(prepped), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    joined = " ".join(prepped)
    if joined.isascii():
        return np.frombuffer(joined.encode("ascii"), dtype=np.uint8), starts
    return np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32), starts


def lower_ascii(cps: np.ndarray) -> np.ndarray:
    """``cps`` with ASCII letters lower-cased (non-ASCII code points were casefolded already)."""
    if cps.dtype == np.uint8:
        return ASCII_LOWER[cps]
    return np.where(cps < 128, ASCII_LOWER[np.minimum(cps, 127)], cps)


@dataclass
class WordHashes:
    """The words of a batch of texts: one uint64 hash per word, and where it is."""

    hashes: np.ndarray  # uint64 [words]
    text: np.ndarray  # int64 [words]: which text of the batch the word belongs to
    first: np.ndarray  # int64 [texts + 1]: text t owns words first[t]:first[t+1]

    def counts(self) -> np.ndarray:
        """Words per text."""
        return np.diff(self.first)


def word_hashes(texts) -> WordHashes:
    """Hash every word (those of ``pipeline.text.words``) of a batch of texts in a few numpy passes.

    A word is a maximal run of word characters in the ``code_points`` buffer; its hash is
    ``mix64(poly ^ length)``, ``poly`` = sum c_j * P**(e-1-j) over its code points [s, e).
    """
    cps, text_starts = code_points(texts)
    is_word = word_table_for(cps)[cps]
    edges = np.diff(is_word.view(np.int8), prepend=np.int8(0), append=np.int8(0))  # +1 at a word's start, -1 after
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if len(starts) == 0:
        return WordHashes(np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(len(texts) + 1, np.int64))
    # prefix[i] = sum_{j<i} c_j * P^-j, so a word's poly, independent of where the word sits, is
    # (prefix[e] - prefix[s]) * P^(e-1): two gathers per word instead of a loop over its characters.
    prefix = np.zeros(len(cps) + 1, dtype=np.uint64)
    np.cumsum(lower_ascii(cps).astype(np.uint64) * powers(P_INV, len(cps)), out=prefix[1:])
    poly = (prefix[ends] - prefix[starts]) * powers(P, len(cps))[ends - 1]
    text = (np.searchsorted(text_starts, starts, side="right") - 1).astype(np.int64)
    first = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.bincount(text, minlength=len(texts)), out=first[1:])
    return WordHashes(mix64(poly ^ (ends - starts).astype(np.uint64)), text, first)
