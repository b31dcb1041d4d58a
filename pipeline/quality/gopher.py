"""Gopher's rule sets (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
from Training Gopher", appendix A.1.1 and table A1), as datatrove implements them
(GopherQualityFilter, GopherRepetitionFilter): same metrics, same order, same comparisons.

The n-gram repetition metrics run in one numba kernel over word numbers (``Doc.word_ids``):
no n-gram strings are built, each n is one sort.
"""
from __future__ import annotations

import numpy as np

from gristmill.jit import cached_njit

from .rules import Rule, ratio
from .text import Doc, find_duplicates, has_alnum, has_alpha

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
REPETITION_RULES = [Rule(f"{REPETITION}:{k}", high=lambda c, k=k: getattr(c, k)) for k in
                    ("dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac",
                     *(f"top_{n}_gram" for n in TOP_N), *(f"dup_{n}_gram" for n in DUP_N))]


def quality_metrics(doc: Doc, cfg) -> dict[str, float]:
    words = doc.words
    n_words = len(words)
    ids, uniq = doc.word_ids
    counts = np.bincount(ids, minlength=len(uniq)) if n_words else np.zeros(0, np.int64)
    alnum = np.fromiter(map(has_alnum, uniq), bool, len(uniq))
    alpha = np.fromiter(map(has_alpha, uniq), bool, len(uniq))
    lengths = np.fromiter(map(len, uniq), np.int64, len(uniq))
    n_alnum = int(counts[alnum].sum())
    text, lines = doc.text, doc.splitlines
    n_lines = len(lines)
    stop = frozenset(cfg.stop_words)
    return {
        f"{QUALITY}:word_count": float(n_alnum),
        f"{QUALITY}:mean_word_length": ratio(float((counts * lengths)[alnum].sum()), n_alnum),
        f"{QUALITY}:hash_ratio": ratio(text.count("#"), n_words),
        f"{QUALITY}:ellipsis_ratio": ratio(text.count("...") + text.count("…"), n_words),
        f"{QUALITY}:bullet_lines": ratio(sum(s.lstrip().startswith(("•", "-")) for s in lines), n_lines),
        f"{QUALITY}:ellipsis_lines": ratio(sum(s.rstrip().endswith(("...", "…")) for s in lines), n_lines),
        f"{QUALITY}:alpha_words": ratio(float(counts[alpha].sum()), n_words),
        # occurrences, not distinct words: datatrove's sum(w in stop_words for w in words)
        f"{QUALITY}:stop_words": float(counts[np.fromiter((u in stop for u in uniq), bool, len(uniq))].sum()),
    }


def repetition_metrics(doc: Doc, cfg) -> dict[str, float]:
    text = doc.text
    n_chars = len(text)
    paras = doc.paragraphs
    para_dups, para_chars = find_duplicates(paras)
    lines = doc.newline_runs
    line_dups, line_chars = find_duplicates(lines)
    ids, _ = doc.word_ids
    top, dup = _ngram_chars(ids, doc.word_lengths, np.array(TOP_N, np.int64), np.array(DUP_N, np.int64))
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
def _groups(ids, n):
    """For each n-gram start, a number shared by equal n-grams; and each number's first start."""
    m = ids.shape[0] - n + 1
    h = np.zeros(m, np.uint64)
    for i in range(m):
        x = np.uint64(1469598103934665603)
        for j in range(n):
            # splitmix64 of the word number, folded in: equal n-grams hash equal, others collide
            # with probability ~m^2 / 2^64
            z = np.uint64(ids[i + j] + 1) * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x = (x ^ (z ^ (z >> np.uint64(31)))) * np.uint64(1099511628211)
        h[i] = x
    order = np.argsort(h, kind="mergesort")  # stable: within a group, starts ascend
    g = np.empty(m, np.int64)
    first = np.empty(m, np.int64)
    k = -1
    for r in range(m):
        i = order[r]
        if r == 0 or h[i] != h[order[r - 1]]:
            k += 1
            first[k] = i
        g[i] = k
    return g, first[:k + 1]


@cached_njit()
def _ngram_chars(ids, wlen, top_ns, dup_ns):
    """Gopher's top n-gram characters (characters of the most frequent n-gram, with its spaces,
    times its count; ties: the earliest) and duplicate n-gram characters (greedy left to right:
    an n-gram seen before counts its characters, without spaces, and skips n words)."""
    m = ids.shape[0]
    cs = np.zeros(m + 1, np.int64)
    for i in range(m):
        cs[i + 1] = cs[i] + wlen[i]
    top = np.zeros(top_ns.shape[0], np.int64)
    for t in range(top_ns.shape[0]):
        n = top_ns[t]
        if m < n:
            continue
        g, first = _groups(ids, n)
        count = np.bincount(g)
        best = 0
        for k in range(count.shape[0]):
            if count[k] > count[best] or (count[k] == count[best] and first[k] < first[best]):
                best = k
        p = first[best]
        top[t] = (cs[p + n] - cs[p] + n - 1) * count[best]
    dup = np.zeros(dup_ns.shape[0], np.int64)
    for t in range(dup_ns.shape[0]):
        n = dup_ns[t]
        if m < n:
            continue
        g, first = _groups(ids, n)
        seen = np.zeros(first.shape[0], np.bool_)
        i, rep = 0, 0
        while i < m - n + 1:
            if seen[g[i]]:
                rep += cs[i + n] - cs[i]
                i += n
            else:
                seen[g[i]] = True
                i += 1
        dup[t] = rep
    return top, dup
