"""loader.order: the pure (seed, global index) -> (shard, row) function."""
import numpy as np
import pytest

from gristmill.loader.order import ORDERS, Order, derive_key, feistel, sample_at, samples_at
from helpers import build_dataset


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    # Uneven shard sizes, so window and shard boundaries never line up by accident.
    pub = build_dataset(str(tmp_path_factory.mktemp("order")), shard_rows=(40, 30, 50, 7, 23), val_rows=(8, 5))
    return pub.manifest


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 17, 63, 64, 65, 1000, 4097])
def test_feistel_is_a_permutation_of_0_to_n(n):
    for seed in range(3):
        p = feistel(np.arange(n), n, derive_key(seed, np.uint64(7), 0))
        assert np.array_equal(np.sort(p), np.arange(n))


def test_feistel_depends_on_the_key_and_is_not_the_identity():
    n = 1000
    a = feistel(np.arange(n), n, derive_key(0, np.uint64(7), 0))
    b = feistel(np.arange(n), n, derive_key(1, np.uint64(7), 0))
    c = feistel(np.arange(n), n, derive_key(0, np.uint64(7), 1))
    assert not np.array_equal(a, np.arange(n))
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    # A shuffle, not a rotation: neighbours land far apart on average.
    assert np.mean(np.abs(np.diff(a.astype(np.int64)))) > n / 10


def test_feistel_accepts_per_element_domains_and_keys():
    n = np.array([5, 9, 9, 1000])
    key = derive_key(3, np.uint64(1), np.array([0, 1, 1, 2]))
    x = np.array([4, 8, 0, 999])
    got = feistel(x, n, key)
    want = [int(feistel([xi], ni, ki)[0]) for xi, ni, ki in zip(x, n, key)]
    assert got.tolist() == want and np.all(got < n)


def test_feistel_refuses_out_of_range_input():
    with pytest.raises(ValueError, match="outside"):
        feistel([5], 5, derive_key(0, np.uint64(1)))


def _rows_of(m, split):
    return {(i, r) for i, s in enumerate(m.shards) if s.split == split for r in range(s.rows)}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("split", ["train", "validation"])
def test_every_row_is_visited_exactly_once_per_epoch(manifest, order, split):
    o = Order(manifest, split, seed=11, order=order, window_shards=2)
    n = o.num_samples
    want = _rows_of(manifest, split)
    assert n == len(want)
    for epoch in range(3):
        shards, rows = o.locate(np.arange(epoch * n, (epoch + 1) * n))
        got = list(zip(shards.tolist(), rows.tolist()))
        assert len(set(got)) == n and set(got) == want


@pytest.mark.parametrize("order", ["global", "window"])
def test_each_epoch_is_a_fresh_permutation_and_seeds_differ(manifest, order):
    o = Order(manifest, "train", seed=0, order=order, window_shards=2)
    n = o.num_samples
    e0 = np.stack(o.locate(np.arange(n)))
    e1 = np.stack(o.locate(np.arange(n, 2 * n)))
    other_seed = np.stack(Order(manifest, "train", seed=1, order=order, window_shards=2).locate(np.arange(n)))
    assert not np.array_equal(e0, e1)
    assert not np.array_equal(e0, other_seed)


def test_sequential_order_is_manifest_order_every_epoch(manifest):
    o = Order(manifest, "train", seed=5, order="sequential")
    n = o.num_samples
    want = sorted(_rows_of(manifest, "train"))
    for epoch in range(2):
        shards, rows = o.locate(np.arange(epoch * n, (epoch + 1) * n))
        assert list(zip(shards.tolist(), rows.tolist())) == want


def test_window_order_reads_one_window_of_shards_at_a_time(manifest):
    k = 2
    o = Order(manifest, "train", seed=3, order="window", window_shards=k)
    n = o.num_samples
    shards, _ = o.locate(np.arange(n))
    # Each maximal run of indices inside one window touches at most k shards, and the number
    # of times the set of shards in use changes is the number of windows.
    perm, perm_offsets, (starts, ends) = o._window_layout(0)
    assert starts.size == -(-len(manifest.shards_of("train")) // k)
    for a, b in zip(starts, ends):
        assert len(set(shards[a:b].tolist())) <= k
    # Rows of a window are interleaved across its shards (shuffled inside the window).
    a, b = starts[0], ends[0]
    assert len(set(shards[a:a + 10].tolist())) > 1


def test_window_order_with_one_window_covers_all_shards(manifest):
    o = Order(manifest, "train", seed=3, order="window", window_shards=100)
    shards, _ = o.locate(np.arange(o.num_samples))
    assert set(shards.tolist()) == {i for i, s in enumerate(manifest.shards) if s.split == "train"}


@pytest.mark.parametrize("order", ORDERS)
def test_sample_at_matches_the_vectorised_form_across_epochs(manifest, order):
    idx = np.random.default_rng(0).integers(0, 10 * 150, size=200)
    shards, rows = samples_at(manifest, "train", 42, order, idx, window=2)
    for i, g in enumerate(idx[:40]):
        assert sample_at(manifest, "train", 42, order, int(g), window=2) == (int(shards[i]), int(rows[i]))
    # The same answer whatever order or chunking the indices are asked in.
    rev_s, rev_r = samples_at(manifest, "train", 42, order, idx[::-1], window=2)
    assert np.array_equal(rev_s[::-1], shards) and np.array_equal(rev_r[::-1], rows)


def test_shard_positions_index_manifest_shards(manifest):
    # Validation shards come after train shards in manifest.shards: the positions must say so.
    shards, _ = samples_at(manifest, "validation", 0, "global", np.arange(13))
    assert set(shards.tolist()) == {i for i, s in enumerate(manifest.shards) if s.split == "validation"}


def test_a_million_indices_map_quickly_and_stay_in_range(manifest):
    o = Order(manifest, "train", seed=9, order="global")
    shards, rows = o.locate(np.arange(1_000_000))
    sizes = np.array([s.rows for s in manifest.shards])
    assert np.all(rows < sizes[shards]) and np.all(rows >= 0)


def test_bad_arguments_are_named(manifest):
    with pytest.raises(ValueError, match="order must be one of"):
        Order(manifest, "train", 0, "random")
    with pytest.raises(ValueError, match="window_shards"):
        Order(manifest, "train", 0, "window", window_shards=0)
    with pytest.raises(ValueError, match="no shards in split 'test'"):
        Order(manifest, "test", 0, "global")
    with pytest.raises(ValueError, match=">= 0"):
        Order(manifest, "train", 0, "global").locate([-1])
