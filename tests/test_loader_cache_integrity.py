"""loader.cache serves a shard's own rows only (issue 26): a manifest whose shard states another
shard's cache facts (raw_sha256, raw_bytes) is refused, whether the other shard is in the same
manifest or only in the cache directory (left there by another dataset)."""
import os
import shutil

import pytest
from helpers import build_dataset
from test_manifest_facts import forge

from gristmill.loader.cache import ShardCache
from gristmill.manifests import FactMismatchError, ManifestError, load_manifest


@pytest.fixture
def pub(tmp_path):
    return build_dataset(str(tmp_path / "data"), shard_rows=(20, 20, 20), val_rows=(4,))


def use(cache, shard):
    cache.pin_ids(cache.ids([shard]))
    return cache.ensure(shard)


def _state_shard_1s_cache_facts(d):
    d["shards"][0]["raw_sha256"] = d["shards"][1]["raw_sha256"]
    d["shards"][0]["raw_bytes"] = d["shards"][1]["raw_bytes"]


def test_a_shard_stating_another_shards_cache_facts_in_the_same_manifest_is_refused(pub, tmp_path):
    honest = ShardCache(str(tmp_path / "cache"), pub, backoff_s=0.0)
    use(honest, pub.manifest.shards[1])  # shard 1's cache form is on disk
    honest.close()
    forge(pub, _state_shard_1s_cache_facts)
    forged = load_manifest(pub.url)
    with pytest.raises(ManifestError, match=r"shards\[1\] .*states the cache form .* of .*shards\[0\].*another's cache facts"):
        ShardCache(str(tmp_path / "cache"), forged, backoff_s=0.0)


def test_a_shard_stating_the_cache_facts_of_a_shard_another_dataset_cached_gets_its_own_file_checked(pub, tmp_path):
    cache_dir = str(tmp_path / "cache")
    honest = ShardCache(cache_dir, pub, backoff_s=0.0)
    use(honest, pub.manifest.shards[1])  # another dataset (here: the honest one) cached shard 1
    assert honest.rows([pub.manifest.shards[1]])[0][0, 0] == 2  # rows of shard s start with s + 1
    honest.close()
    # A second dataset: shard 0's file, and a manifest stating shard 1's cache facts for it (shard 1 dropped).
    other = str(tmp_path / "other" / "toy" / "v1")
    shutil.copytree(pub.url, other)

    def edit(d):
        _state_shard_1s_cache_facts(d)
        del d["shards"][1]

    with open(os.path.join(os.path.dirname(other), "latest"), "w") as f:
        f.write("1")
    forge(load_manifest(other), edit)
    forged = load_manifest(other)
    cache = ShardCache(cache_dir, forged, retries=2, backoff_s=0.0)
    with pytest.raises(FactMismatchError, match=r"train-.* \(its uncompressed cache form\): raw_sha256: manifest states"):
        use(cache, forged.manifest.shards[0])  # never shard 1's rows
    cache.close()
    again = ShardCache(cache_dir, pub, backoff_s=0.0)
    assert use(again, pub.manifest.shards[1]).downloaded_bytes == 0  # the honest entry is intact and still a hit
    again.close()


def test_a_cached_file_without_its_link_is_fetched_once_then_hits(pub, tmp_path):
    cache_dir = str(tmp_path / "cache")
    a = pub.manifest.shards[0]
    first = ShardCache(cache_dir, pub, backoff_s=0.0)
    assert use(first, a).downloaded_bytes == a.bytes
    first.close()
    assert os.path.exists(os.path.join(cache_dir, f"{a.raw_sha256}.src-{a.sha256}"))
    os.unlink(os.path.join(cache_dir, f"{a.raw_sha256}.src-{a.sha256}"))  # a cache dir from before the link markers
    second = ShardCache(cache_dir, pub, backoff_s=0.0)
    assert use(second, a).downloaded_bytes == a.bytes
    second.close()
    third = ShardCache(cache_dir, pub, backoff_s=0.0)
    assert use(third, a).downloaded_bytes == 0
    third.close()
