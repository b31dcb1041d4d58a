"""loader.cache.ShardCache: pins, eviction order, verification, locks shared across processes."""
import fcntl
import os

import pytest

from helpers import build_dataset, flip_byte
from gristmill.loader.cache import CacheFullError, ShardCache, ShardFetchError


@pytest.fixture(scope="module")
def pub(tmp_path_factory):
    # Four train shards of equal size, so "room for exactly two" is easy to state.
    return build_dataset(str(tmp_path_factory.mktemp("cache")), shard_rows=(20, 20, 20, 20), val_rows=(4,))


def cache_for(pub, tmp_path, shards_room=None, **kw):
    size = pub.manifest.shards[0].raw_bytes
    limit = None if shards_room is None else shards_room * size
    return ShardCache(str(tmp_path), pub, limit_bytes=limit, backoff_s=0.0, **kw)


def pin(cache, shard):
    cache.pin_ids(cache.ids([shard]))


def unpin(cache, shard):
    cache.unpin_ids(cache.ids([shard]))


def use(cache, shard):
    """Pin and ensure: what the loader does before gathering."""
    pin(cache, shard)
    return cache.ensure(shard)


def on_disk(cache, shards):
    return [os.path.exists(cache.path(s)) for s in shards]


def test_ensure_downloads_once_and_maps_the_rows(pub, tmp_path):
    a = pub.manifest.shards[0]
    cache = cache_for(pub, tmp_path)
    assert use(cache, a).downloaded_bytes == a.bytes
    assert use(cache, a).downloaded_bytes == 0  # already mapped: no work
    rows = cache.rows([a])[0]
    assert rows.shape == (20, 17) and rows[:, 0].tolist() == [1] * 20  # first token names shard 0
    cache.close()


def test_eviction_never_touches_a_pinned_shard_and_frees_lru_first(pub, tmp_path):
    a, b, c, d = pub.manifest.shards_of("train")
    cache = cache_for(pub, tmp_path, shards_room=2, full_timeout_s=0.2)
    use(cache, a)
    use(cache, b)
    with pytest.raises(CacheFullError, match="every cached shard is pinned"):
        use(cache, c)  # a and b are both pinned: nothing may go
    assert on_disk(cache, [a, b, c]) == [True, True, False]
    unpin(cache, c)  # the failed attempt's pin
    unpin(cache, a)
    use(cache, c)  # room is made by evicting a, the only unpinned shard
    assert on_disk(cache, [a, b, c]) == [False, True, True]
    unpin(cache, b)
    unpin(cache, c)
    use(cache, c)  # c used again: b is now the least recently used
    unpin(cache, c)
    use(cache, d)
    assert on_disk(cache, [b, c, d]) == [False, True, True]
    assert cache.cached_bytes() <= 2 * a.raw_bytes
    cache.close()


def test_a_pin_held_by_another_process_blocks_eviction(pub, tmp_path):
    a, b, c, _ = pub.manifest.shards_of("train")
    cache = cache_for(pub, tmp_path, shards_room=2, full_timeout_s=0.2)
    for s in (a, b):
        use(cache, s)
        unpin(cache, s)
    # Another process pins a: flock locks belong to open file descriptions, so a second open
    # of the .pin file behaves exactly like another process.
    fd = os.open(os.path.join(str(tmp_path), f"{a.raw_sha256}.pin"), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        use(cache, c)
        assert on_disk(cache, [a, b, c]) == [True, False, True]  # b went, the other process's a stayed
    finally:
        os.close(fd)
    cache.close()


def test_a_corrupt_cached_file_is_replaced_on_first_use(pub, tmp_path):
    a = pub.manifest.shards[0]
    first = cache_for(pub, tmp_path)
    use(first, a)
    first.close()
    flip_byte(first.path(a))
    second = cache_for(pub, tmp_path)
    assert use(second, a).downloaded_bytes == a.bytes  # detected by the raw_sha256 check, fetched again
    from gristmill.manifests import sha256_file
    assert sha256_file(second.path(a))[0] == a.raw_sha256
    second.close()


def test_a_shard_missing_from_the_store_names_itself(tmp_path):
    pub = build_dataset(str(tmp_path / "ds"), shard_rows=(20, 20), val_rows=(4,))
    gone = pub.manifest.shards[0]
    os.remove(os.path.join(pub.url, gone.path))  # deleted from the store after publishing
    cache = cache_for(pub, tmp_path / "cache", retries=2)
    pin(cache, gone)
    with pytest.raises(ShardFetchError, match=f"shard {gone.path} .* failed 2 attempts"):
        cache.ensure(gone)
    cache.close()


def test_limits_are_validated(pub, tmp_path):
    with pytest.raises(ValueError, match="cache_limit_bytes must be positive"):
        ShardCache(str(tmp_path), pub, limit_bytes=0)
    with pytest.raises(ValueError, match="retries must be >= 1"):
        ShardCache(str(tmp_path), pub, retries=0)


def test_released_pages_read_back_the_same_rows(pub, tmp_path):
    a = pub.manifest.shards[0]
    cache = cache_for(pub, tmp_path)
    use(cache, a)
    before = cache.rows([a])[0].copy()
    cache.release_pages()
    assert (cache.rows([a])[0] == before).all()
    cache.close()


def test_rows_outside_the_file_mapping_are_never_released():
    """A multi-chunk shard's rows are concatenated into ordinary memory, which MADV_DONTNEED would zero."""
    import numpy as np

    from gristmill.loader.residency import file_pages as _file_pages

    class Copied:  # rows in ordinary memory, the mapping elsewhere
        rows = np.ones((4, 8), np.uint16)

        def mapping(self):
            return self.rows.ctypes.data + self.rows.nbytes + 4096, 1 << 20

    assert _file_pages(Copied()) is None
