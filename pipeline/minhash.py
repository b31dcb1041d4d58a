"""MinHash signatures of normalised word shingles, vectorised over a whole batch of documents.

Semantics follow ``datasketch.MinHash`` (2.x, default scheme ``affine32``): every shingle gets a
32-bit hash, that hash is pre-mixed once with the MurmurHash3 finalizer, and permutation ``k``
maps it to ``a_k * h + b_k mod 2**32`` with ``(a, b)`` drawn exactly as datasketch draws them from
``np.random.RandomState(seed)``. So ``datasketch.MinHash(num_perm, seed=seed, hashfunc=int)`` fed
our shingle hashes gives bit-identical signatures (tests/test_minhash.py checks this).

What differs is the speed. datasketch hashes shingles one by one in Python; here a whole batch
of documents becomes one code-point buffer (``pipeline.wordhash.code_points``; words are exactly
``pipeline.text.words``, hashed as ``pipeline.wordhash.word_hashes`` hashes them), and two numba
loops do the rest in one pass each:

1. shingles: a polynomial hash of each word's code points, mixed; ``n`` consecutive word hashes
   combined with per-position multipliers, mixed again (64 bits per shingle);
2. signatures: for every shingle and permutation, ``a_k * h + b_k`` and a running minimum.

Without numba the same values come from whole-batch numpy (prefix sums for word hashes, a
``(shingles, num_perm)`` matrix and ``np.minimum.reduceat``), several times slower.

A document with fewer than ``n`` words is one shingle (all its words); a document with no words
has no shingles and the all-ones "empty" signature (datasketch's initial value). Callers must not
treat two empty signatures as similar (the fuzzy-dedup stage skips empty documents).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gristmill.jit import cached_njit
from .wordhash import ASCII_LOWER, P, code_points, mix64, mix64_jit, word_hashes, word_table_for

try:  # numba fuses the loops (an order of magnitude faster than numpy); results are identical without it
    import numba
except ImportError:  # pragma: no cover - exercised by forcing use_numba=False in tests
    numba = None

MAX_HASH = np.uint32(0xFFFFFFFF)  # the value of an empty signature, as in datasketch
_CHUNK_ROWS = 8192  # shingle rows per (rows, num_perm) matrix: 4 MiB at 128 permutations, cache-friendly


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer, the pre-mix datasketch applies before its permutations."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(a, b)`` uint32 permutation parameters datasketch's ``affine32`` scheme draws."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


@dataclass
class Shingles:
    """The shingle hashes of a batch: ``hashes[offsets[i]:offsets[i+1]]`` belong to document i."""

    hashes: np.ndarray  # uint64, one per shingle position (duplicates kept; MinHash ignores them)
    offsets: np.ndarray  # int64, len(docs) + 1

    def of(self, i: int) -> np.ndarray:
        return self.hashes[self.offsets[i] : self.offsets[i + 1]]

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass
class MinHasher:
    """Signatures of ``ngram``-word shingles under ``num_perm`` permutations drawn from ``seed``."""

    num_perm: int = 128
    ngram: int = 5
    seed: int = 1
    _a: np.ndarray = field(init=False, repr=False)
    _b: np.ndarray = field(init=False, repr=False)
    _mult: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        if self.num_perm < 1 or self.ngram < 1:
            raise ValueError(f"num_perm and ngram must be >= 1, got num_perm={self.num_perm}, ngram={self.ngram}")
        self._a, self._b = permutations(self.num_perm, self.seed)
        # Per-position shingle multipliers: odd, distinct, fixed (shingles are order-sensitive).
        self._mult = mix64(np.arange(1, self.ngram + 1, dtype=np.uint64)) | np.uint64(1)

    def word_hashes(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """uint64 hashes of the words of ``pipeline.text.words(t)`` for every text, and word counts."""
        wh = word_hashes(texts)  # pipeline.wordhash: the project's one vectorised word hasher
        return wh.hashes, wh.counts()

    def shingles(self, texts, use_numba: bool | None = None) -> Shingles:
        """uint64 hashes of each text's ``ngram``-word shingles (a short text is one shingle)."""
        if not _numba_on(use_numba):
            return self._shingles_numpy(texts)
        cps, doc_starts = code_points(texts)
        ends = np.append(doc_starts[1:] - 1, len(cps)).astype(np.int64)  # each text's last code point + 1
        out = np.empty(len(cps) // 2 + len(texts) + 1, dtype=np.uint64)  # words <= (chars + 1) / 2
        counts = np.zeros(len(texts), dtype=np.int64)
        n = _shingle_loops(cps, word_table_for(cps), ASCII_LOWER, doc_starts, ends, self._mult, out, counts)
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return Shingles(out[:n].copy(), offsets)

    def _shingles_numpy(self, texts) -> Shingles:
        """Reference path of ``shingles``: whole-batch numpy, identical output."""
        words, counts = self.word_hashes(texts)
        n = self.ngram
        n_shingles = np.where(counts >= n, counts - n + 1, np.minimum(counts, 1))
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(n_shingles, out=offsets[1:])
        if offsets[-1] == 0:
            return Shingles(np.zeros(0, dtype=np.uint64), offsets)
        # Lay words out with n-1 zero slots after each document, so a window never crosses into
        # the next document and a short document's single window holds just its own words.
        doc_of_word = np.repeat(np.arange(len(counts)), counts)
        padded = np.zeros(len(words) + len(counts) * (n - 1), dtype=np.uint64)
        padded[np.arange(len(words)) + doc_of_word * (n - 1)] = words
        window = np.zeros(len(padded) - n + 1, dtype=np.uint64)
        for j in range(n):
            window += padded[j : j + len(window)] * self._mult[j]
        doc_start = np.concatenate(([0], np.cumsum(counts)[:-1])) + np.arange(len(counts)) * (n - 1)
        doc_of_shingle = np.repeat(np.arange(len(counts)), n_shingles)
        pos = doc_start[doc_of_shingle] + (np.arange(offsets[-1]) - offsets[doc_of_shingle])
        return Shingles(mix64(window[pos]), offsets)

    def signatures_of(self, sh: Shingles, use_numba: bool | None = None) -> np.ndarray:
        """``(docs, num_perm)`` uint32 MinHash signatures of precomputed shingles."""
        sig = np.full((len(sh.offsets) - 1, self.num_perm), MAX_HASH, dtype=np.uint32)
        # datasketch's hashfunc gives 32 bits: use the low half of our 64-bit shingle hash.
        h = _fmix32((sh.hashes & np.uint64(0xFFFFFFFF)).astype(np.uint32))
        if _numba_on(use_numba):
            _min_hash_loops(h, sh.offsets, self._a, self._b, sig)
        else:
            _min_hash_numpy(h, sh.offsets, self._a, self._b, sig)
        return sig

    def signatures(self, texts) -> np.ndarray:
        """``(len(texts), num_perm)`` uint32 MinHash signatures of the texts."""
        return self.signatures_of(self.shingles(texts))


def _numba_on(use_numba: bool | None) -> bool:
    return numba is not None if use_numba is None else use_numba


def _jit(fn):
    """numba-compile a loop function when numba is installed (cached on disk, releases the GIL)."""
    return cached_njit(nogil=True)(fn) if numba is not None else fn


@_jit
def _shingle_loops(cps, word_table, ascii_lower, starts, ends, mult, out, counts) -> int:
    """One pass over the code points: Horner word hashes, a ring of the last n, one hash per window.

    Kept fused here (not built on ``wordhash.word_hashes``) because one pass with no temporaries is
    what makes it fast; its tables, base and mixer all come from ``pipeline.wordhash``, so it gives
    the same values as the numpy path: Horner's sum c_j * P^(e-1-j) is the prefix-sum formula, and
    a short document's window is its m < n words with the multipliers mult[0..m-1].

    Caveat: numba's disk cache (``cache=True``) is keyed on this file only; it does not notice a
    change to ``wordhash.mix64`` or ``wordhash.P``, which are compiled into it. After changing those
    delete ``pipeline/__pycache__/minhash.*.nbi/.nbc`` (the numba-vs-numpy test catches a stale one).
    """
    n = len(mult)
    ring = np.zeros(n, dtype=np.uint64)
    emitted = 0
    for d in range(len(starts)):
        n_words = 0
        h = np.uint64(0)
        length = np.uint64(0)
        for i in range(starts[d], ends[d] + 1):
            c = np.uint32(cps[i]) if i < ends[d] else np.uint32(32)
            is_word = word_table[c]  # all of Unicode for a uint32 buffer, ASCII for a uint8 one
            if c < 128:  # non-ASCII texts were NFKC + casefolded by code_points already
                c = ascii_lower[c]
            if is_word:
                h = h * np.uint64(P) + np.uint64(c)
                length += np.uint64(1)
                continue
            if length == 0:
                continue
            ring[n_words % n] = mix64_jit(h ^ length)
            n_words += 1
            h = np.uint64(0)
            length = np.uint64(0)
            if n_words >= n:
                acc = np.uint64(0)
                for j in range(n):
                    acc += ring[(n_words - n + j) % n] * mult[j]
                out[emitted] = mix64_jit(acc)
                emitted += 1
        if 0 < n_words < n:
            acc = np.uint64(0)
            for j in range(n_words):
                acc += ring[j] * mult[j]
            out[emitted] = mix64_jit(acc)
            emitted += 1
        counts[d] = max(n_words - n + 1, 1) if n_words else 0
    return emitted


def _min_hash_numpy(h, offsets, a, b, sig) -> None:
    """Reference path: a (shingles, num_perm) matrix per chunk of documents, min per document."""
    counts = np.diff(offsets)
    nonempty = np.flatnonzero(counts)
    # Cut documents into chunks of about _CHUNK_ROWS shingles so the matrix stays in cache.
    chunk_of = (offsets[nonempty] // _CHUNK_ROWS).astype(np.int64)
    bounds = np.flatnonzero(np.diff(chunk_of, prepend=-1, append=chunk_of[-1] + 1 if len(chunk_of) else 0))
    for first, last in zip(bounds[:-1], bounds[1:]):
        docs = nonempty[first:last]
        lo, hi = offsets[docs[0]], offsets[docs[-1] + 1]
        perm = h[lo:hi, None] * a[None, :]
        perm += b[None, :]
        sig[docs] = np.minimum.reduceat(perm, offsets[docs] - lo, axis=0)


@_jit
def _min_hash_loops(h, offsets, a, b, sig) -> None:
    """The same minimum as _min_hash_numpy, as loops numba compiles to SIMD code without temporaries."""
    mask = np.uint64(0xFFFFFFFF)
    for d in range(len(offsets) - 1):
        row = sig[d]
        for i in range(offsets[d], offsets[d + 1]):
            x = np.uint64(h[i])
            for k in range(len(a)):
                v = np.uint32((np.uint64(a[k]) * x + np.uint64(b[k])) & mask)  # mod 2**32
                if v < row[k]:
                    row[k] = v





def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two shingle-hash arrays (as sets); 0.0 when both are empty."""
    a, b = np.unique(a), np.unique(b)
    union = len(a) + len(b)
    if union == 0:
        return 0.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (union - inter)


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """MinHash estimate of Jaccard: the fraction of equal signature entries (row-wise for 2-D)."""
    return np.mean(np.asarray(sig_a) == np.asarray(sig_b), axis=-1)
