"""MinHash signatures and LSH parameters: datasketch semantics, pipeline.text words, accuracy."""
import random

import numpy as np
import pytest

from gristmill.pipeline.lsh import band_keys, make_params, optimal_params
from gristmill.pipeline.minhash import MAX_HASH, MinHasher, estimate_jaccard, jaccard, numba, permutations
from gristmill.pipeline.text import words

PATHS = [False, True] if numba is not None else [False]

ALPHABET = [chr(c) for c in range(128)] + list("éÉßﬁ½²İıΣσς–—“”’…日本語한국어١٢٣ǅǄ \u00ad\u200b\u00a0Ⅻ")


def random_texts(seed=0, n=400):
    rng = random.Random(seed)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 80))) for _ in range(n)]
    return texts + ["Hello, World! x_y", "", "   ", "ÀB ﬁne  STRASSE straße", "one two three four five six"]


def prose(rng, vocab, n_words):
    return " ".join(rng.choice(vocab) for _ in range(n_words))


@pytest.fixture(scope="module")
def vocab():
    rng = random.Random(7)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]


@pytest.mark.parametrize("use_numba", PATHS)
def test_shingles_are_windows_of_pipeline_text_words(use_numba):
    mh = MinHasher(ngram=3)
    texts = random_texts()
    sh = mh.shingles(texts, use_numba=use_numba)
    for i, t in enumerate(texts):
        w = words(t)
        windows = [" ".join(w[j : j + 3]) for j in range(len(w) - 2)] or ([" ".join(w)] if w else [])
        assert sh.counts()[i] == len(windows), repr(t)
        # Each window on its own is a one-shingle text: same hash wherever it sits in a document.
        alone = mh.shingles(windows, use_numba=use_numba).hashes if windows else np.zeros(0, np.uint64)
        assert np.array_equal(sh.of(i), alone), repr(t)


def test_numba_and_numpy_paths_agree(vocab):
    assert numba is not None  # numba is a dependency; the numpy path is the reference
    rng = random.Random(1)
    texts = random_texts(1) + [prose(rng, vocab, rng.randint(0, 700)) for _ in range(300)]
    mh = MinHasher()
    a, b = mh.shingles(texts, use_numba=True), mh.shingles(texts, use_numba=False)
    assert np.array_equal(a.hashes, b.hashes) and np.array_equal(a.offsets, b.offsets)
    assert np.array_equal(mh.signatures_of(a, use_numba=True), mh.signatures_of(a, use_numba=False))


def test_distinct_shingles_get_distinct_hashes(vocab):
    mh = MinHasher(ngram=2)
    pairs = sorted({f"{a} {b}" for a in vocab[:300] for b in vocab[:300:7]})
    h = mh.shingles(pairs).hashes
    assert len(np.unique(h)) == len(pairs)
    assert mh.shingles(["a b"]).hashes[0] != mh.shingles(["b a"]).hashes[0]  # order matters


@pytest.mark.parametrize("seed,num_perm", [(1, 128), (42, 64)])
def test_signatures_equal_datasketch_fed_the_same_shingle_hashes(vocab, seed, num_perm):
    from datasketch import MinHash  # here, not at collection: ~1 s of import (scipy) a worker

    rng = random.Random(seed)
    texts = [prose(rng, vocab, rng.randint(1, 300)) for _ in range(30)]
    mh = MinHasher(num_perm=num_perm, seed=seed)
    sh = mh.shingles(texts)
    sig = mh.signatures_of(sh)
    a, b = permutations(num_perm, seed)
    ref_perm = MinHash(num_perm=num_perm, seed=seed).permutations
    assert np.array_equal(a, ref_perm[0]) and np.array_equal(b, ref_perm[1])
    for i in range(len(texts)):
        m = MinHash(num_perm=num_perm, seed=seed, hashfunc=int)  # datasketch's default scheme, affine32
        m.update_batch((sh.of(i) & np.uint64(0xFFFFFFFF)).tolist())
        assert np.array_equal(sig[i], m.hashvalues), i


def test_short_and_empty_documents():
    mh = MinHasher()
    sh = mh.shingles(["just three words", "", "!!! ...", "Just three WORDS."])
    assert sh.counts().tolist() == [1, 0, 0, 1]
    sig = mh.signatures_of(sh)
    assert np.array_equal(sig[0], sig[3])  # same words after normalisation
    assert (sig[1] == MAX_HASH).all() and (sig[2] == MAX_HASH).all()


def test_jaccard_estimates_as_accurate_as_datasketch(vocab):
    """Mean absolute error against exact Jaccard, ours vs datasketch's own (SHA-1) shingle hashing."""
    from datasketch import MinHash

    rng = random.Random(3)
    mh = MinHasher(num_perm=128)
    ours, theirs = [], []
    for k in range(120):
        base = [rng.choice(vocab) for _ in range(200)]
        other = list(base)
        for pos in rng.sample(range(200), k % 40):
            other[pos] = rng.choice(vocab)
        a, b = " ".join(base), " ".join(other)
        sh = mh.shingles([a, b])
        exact = jaccard(sh.of(0), sh.of(1))
        ours.append(abs(estimate_jaccard(*mh.signatures_of(sh)) - exact))
        ds = []
        for t in (a, b):
            w = words(t)
            m = MinHash(num_perm=128)
            m.update_batch([" ".join(w[i : i + 5]).encode() for i in range(len(w) - 4)])
            ds.append(m)
        theirs.append(abs(ds[0].jaccard(ds[1]) - exact))
    assert np.mean(ours) < 0.05
    assert np.mean(ours) <= 1.25 * np.mean(theirs), (np.mean(ours), np.mean(theirs))


@pytest.mark.parametrize("threshold,num_perm,weights", [(0.8, 128, (0.5, 0.5)), (0.8, 128, (0.1, 0.9)),
                                                         (0.5, 64, (0.5, 0.5)), (0.9, 256, (0.3, 0.7))])
def test_lsh_parameters_match_datasketch_search(threshold, num_perm, weights):
    from datasketch.lsh import _optimal_param

    p = optimal_params(threshold, num_perm, *weights)
    assert (p.bands, p.rows) == _optimal_param(threshold, num_perm, *weights)
    assert 0 < p.false_positive < 0.5 and 0 < p.false_negative < 0.5


def test_lsh_parameter_errors_and_collision_curve():
    with pytest.raises(ValueError, match="threshold"):
        optimal_params(1.0, 128)
    with pytest.raises(ValueError, match="num_perm=128"):
        make_params(0.8, 128, 20, 10)
    p = make_params(0.8, 128, 9, 13)
    assert p.collision_probability(0.95) > 0.99 > 0.1 > p.collision_probability(0.5)


def test_band_keys_equal_exactly_when_the_band_is_equal():
    rng = np.random.default_rng(0)
    sig = rng.integers(0, 2**32, size=(50, 128), dtype=np.uint64).astype(np.uint32)
    other = sig.copy()
    other[:, 13] += 1  # differs only in band 1 of 9 x 13
    k1, k2 = band_keys(sig, 9, 13), band_keys(other, 9, 13)
    assert k1.shape == (50, 9)
    assert (k1[:, 1] != k2[:, 1]).all()
    assert (np.delete(k1, 1, axis=1) == np.delete(k2, 1, axis=1)).all()
    assert len(np.unique(k1)) == k1.size
