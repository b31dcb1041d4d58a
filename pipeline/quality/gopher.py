"""Gopher's rule sets (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
from Training Gopher", appendix A.1.1 and table A1), as datatrove implements them
(GopherQualityFilter, GopherRepetitionFilter): same metrics, same order, same comparisons.

The n-gram repetition metrics run in one numba kernel over word hashes (``Doc.words``, ``text.analyse``):
no n-gram strings are built; each n-gram is a 64-bit hash, extended by one word from the (n-1)-gram's,
and equal hashes are grouped in one pass over an open-addressing table.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from gristmill.jit import cached_njit

from .rules import Rule, ratio
from .text import Doc, find_duplicates, word_hashes

QUALITY, REPETITION = "gopher_quality", "gopher_repetition"

QUALITY_RULES = [
    Rule(f"{QUALITY}:word_count", low=lambda c: c.min_doc_words, high=lambda c: c.max_doc_words),
    Rule(f"{QUALITY}:mean_word_length", low=lambda c: c.min_avg_word_length, high=lambda c: c.max_avg_word_length),
    Rule(f"{QUALITY}:hash_ratio", high=lambda c: c.max_symbol_word_ratio),
    Rule(f"{QUALITY}:ellipsis_ratio", high=lambda c: c.max_symbol_word_ratio),
    Rule(f"{QUALITY}:bullet_lines", high=lambda c: c.max_bullet_lines_ratio),
    Rule(f"{QUALITY}:ellipsis_lines", high=lambda c: c.max_ellipsis_lines_ratio),
    Rule(f"{QUALITY}:alpha_words", low=lambda c: c.min_alpha_words_ratio),
    Rule(f"{QUALITY}:stop_words", low=lambda c: c.min_stop_words),
]

TOP_N, DUP_N = (2, 3, 4), (5, 6, 7, 8, 9, 10)
_TOP_N, _DUP_N = np.array(TOP_N, np.int64), np.array(DUP_N, np.int64)
REPETITION_RULES = [Rule(f"{REPETITION}:{k}", high=lambda c, k=k: getattr(c, k)) for k in
                    ("dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac",
                     *(f"top_{n}_gram" for n in TOP_N), *(f"dup_{n}_gram" for n in DUP_N))]


def quality_metrics(doc: Doc, cfg) -> dict[str, float]:
    words = doc.words
    n_words = len(words.hashes)
    n_alnum, alnum_chars, n_alpha, n_stop = _word_sums(words.hashes, words.lengths, words.kinds,
                                                       _stop_hashes(tuple(cfg.stop_words)))
    text, lines = doc.text, doc.splitlines
    n_lines = len(lines)
    return {
        f"{QUALITY}:word_count": float(n_alnum),
        f"{QUALITY}:mean_word_length": ratio(float(alnum_chars), n_alnum),
        f"{QUALITY}:hash_ratio": ratio(text.count("#"), n_words),
        f"{QUALITY}:ellipsis_ratio": ratio(text.count("...") + text.count("…"), n_words),
        f"{QUALITY}:bullet_lines": ratio(sum(s.lstrip().startswith(("•", "-")) for s in lines), n_lines),
        f"{QUALITY}:ellipsis_lines": ratio(sum(s.rstrip().endswith(("...", "…")) for s in lines), n_lines),
        f"{QUALITY}:alpha_words": ratio(float(n_alpha), n_words),
        # occurrences, not distinct words: datatrove's sum(w in stop_words for w in words)
        f"{QUALITY}:stop_words": float(n_stop),
    }


@lru_cache(maxsize=16)
def _stop_hashes(stop_words: tuple[str, ...]) -> np.ndarray:
    return word_hashes(sorted(set(stop_words)))


@cached_njit()
def _word_sums(hashes, lengths, kinds, stop):
    """(words with a letter or digit, their characters, words with a letter, stop-word occurrences):
    each word's hash, length and kind (``text.Words``), ``stop`` the stop words' hashes (a few)."""
    n_alnum = chars = n_alpha = n_stop = 0
    for i in range(hashes.shape[0]):
        k = kinds[i]
        if k & 1:
            n_alnum += 1
            chars += lengths[i]
        if k & 2:
            n_alpha += 1
        h = hashes[i]
        for s in stop:
            if h == s:
                n_stop += 1
                break
    return n_alnum, chars, n_alpha, n_stop


def repetition_metrics(doc: Doc, cfg) -> dict[str, float]:
    text = doc.text
    n_chars = len(text)
    paras = doc.paragraphs
    para_dups, para_chars = find_duplicates(paras)
    lines = doc.newline_runs
    line_dups, line_chars = find_duplicates(lines)
    top, dup = _ngram_chars(doc.words.hashes, doc.words.lengths, _TOP_N, _DUP_N)
    out = {f"{REPETITION}:dup_para_frac": ratio(para_dups, len(paras)),
           f"{REPETITION}:dup_para_char_frac": ratio(para_chars, n_chars),
           f"{REPETITION}:dup_line_frac": ratio(line_dups, len(lines)),
           f"{REPETITION}:dup_line_char_frac": ratio(line_chars, n_chars)}
    for n, c in zip(TOP_N, top):
        out[f"{REPETITION}:top_{n}_gram"] = ratio(float(c), n_chars)
    for n, c in zip(DUP_N, dup):
        out[f"{REPETITION}:dup_{n}_gram"] = ratio(float(c), n_chars)
    return out


@cached_njit()
def _extend(h, z, n):
    """The hashes of the n-grams from those of the (n-1)-grams (``h``, one longer), FNV-1a style: equal
    n-grams hash equal, others collide with probability ~m^2 / 2^64."""
    m = z.shape[0] - n + 1
    out = np.empty(m, np.uint64)
    for i in range(m):
        out[i] = (h[i] ^ z[i + n - 1]) * np.uint64(1099511628211)
    return out


@cached_njit()
def _groups(h):
    """For each n-gram start, a number shared by equal hashes (numbered in order of first occurrence),
    and each number's first start: one pass over an open-addressing table of twice the starts."""
    m = h.shape[0]
    cap = 2
    while cap < 2 * m:
        cap *= 2
    mask = np.uint64(cap - 1)
    keys = np.empty(cap, np.uint64)
    slot = np.full(cap, -1, np.int64)
    g = np.empty(m, np.int64)
    first = np.empty(m, np.int64)
    k = 0
    for i in range(m):
        x = h[i]
        s = (x ^ (x >> np.uint64(32))) & mask
        while slot[s] != -1 and keys[s] != x:
            s = (s + np.uint64(1)) & mask
        if slot[s] == -1:
            keys[s] = x
            slot[s] = k
            first[k] = i
            k += 1
        g[i] = slot[s]
    return g, first[:k]


@cached_njit()
def _ngram_chars(z, lengths, top_ns, dup_ns):
    """Gopher's top n-gram characters (characters of the most frequent n-gram, with its spaces,
    times its count; ties: the earliest) and duplicate n-gram characters (greedy left to right:
    an n-gram seen before counts its characters, without spaces, and skips n words), from each word's
    hash ``z`` and length.
    ``top_ns`` and ``dup_ns`` ascend, the first above 1. Once every n-gram is distinct the longer ones
    are too: their duplicate characters stay 0 (on prose, most of the longer n)."""
    m = z.shape[0]
    cs = np.zeros(m + 1, np.int64)
    for i in range(m):
        cs[i + 1] = cs[i] + lengths[i]
    top = np.zeros(top_ns.shape[0], np.int64)
    dup = np.zeros(dup_ns.shape[0], np.int64)
    h = np.empty(m, np.uint64)
    for i in range(m):
        h[i] = (np.uint64(1469598103934665603) ^ z[i]) * np.uint64(1099511628211)
    n = 1
    distinct = False
    for t in range(top_ns.shape[0] + dup_ns.shape[0]):
        want = top_ns[t] if t < top_ns.shape[0] else dup_ns[t - top_ns.shape[0]]
        if m < want:
            break
        while n < want:
            n += 1
            h = _extend(h, z, n)
        if t >= top_ns.shape[0] and distinct:  # no two (n-1)-grams equal: no two n-grams either, none repeats
            break
        g, first = _groups(h)
        distinct = first.shape[0] == m - n + 1
        if t < top_ns.shape[0]:
            count = np.bincount(g)
            best = 0
            for k in range(count.shape[0]):  # groups are in order of first start: the first maximum is the earliest
                if count[k] > count[best]:
                    best = k
            p = first[best]
            top[t] = (cs[p + n] - cs[p] + n - 1) * count[best]
        else:
            seen = np.zeros(first.shape[0], np.bool_)
            i, rep = 0, 0
            while i < m - n + 1:
                if seen[g[i]]:
                    rep += cs[i + n] - cs[i]
                    i += n
                else:
                    seen[g[i]] = True
                    i += 1
            dup[t - top_ns.shape[0]] = rep
    return top, dup
