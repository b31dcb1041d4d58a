"""The Loader: deterministic batches, exact resume, verified cache, flaky remotes, cache limits."""
import os
import threading

import fsspec
import numpy as np
import pytest
import torch

from helpers import build_dataset, flip_byte
from gristmill.loader import (Batches, CacheTooSmallError, Caching, Loader, Sampling, ShardFetchError, Source, Threads,
                              samples_at)
from gristmill.loader.options import sections
from gristmill.manifests.storage import register_simulated_store, simulated_url
from gristmill.manifests import HashMismatchError, join, read_rows

register_simulated_store()  # gmsim://: importing the loader registers nothing (test_importing_the_loader_registers_no_simulated_store)


@pytest.fixture(scope="module")
def pub(tmp_path_factory):
    return build_dataset(str(tmp_path_factory.mktemp("loader")))


@pytest.fixture(scope="module")
def rows_by_shard(pub):
    return [read_rows(os.path.join(pub.url, s.path)) for s in pub.manifest.shards]


def take(loader, steps):
    out = []
    for i, batch in enumerate(loader):
        out.append(batch)
        if i + 1 == steps:
            break
    return out


def run(pub, cache_dir, steps=6, **kw):
    kw.setdefault("global_batch", 8)
    with Loader(pub.url if "url" not in kw else kw.pop("url"), **sections(cache_dir=str(cache_dir), **kw)) as ld:
        return take(ld, steps)


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x["step"] == y["step"]
        for k in ("input_ids", "labels", "indices"):
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("token_dtype, want_dtype", [(torch.int64, torch.int64), (None, torch.uint16)])
def test_batches_are_the_rows_the_order_names_shifted_by_one(pub, rows_by_shard, tmp_path, token_dtype, want_dtype):
    batches = run(pub, tmp_path, steps=4, seed=3, order="global", token_dtype=token_dtype)
    for step, b in enumerate(batches):
        assert b["step"] == step
        assert b["indices"].tolist() == list(range(step * 8, step * 8 + 8))
        tokens = b["tokens"]
        assert tokens.dtype == want_dtype and tokens.shape == (8, 17) and tokens.is_contiguous()
        assert b["input_ids"].shape == (8, 16) == b["labels"].shape
        # inputs and labels are views of the one buffer, not copies
        assert b["input_ids"].data_ptr() == tokens.data_ptr()
        assert b["labels"].data_ptr() == tokens.data_ptr() + tokens.element_size()
        assert b["input_ids"].untyped_storage().data_ptr() == tokens.untyped_storage().data_ptr()
        shards, rows = samples_at(pub.manifest, "train", 3, "global", b["indices"].numpy())
        want = np.stack([rows_by_shard[s][r] for s, r in zip(shards, rows)]).astype(np.int64)
        assert np.array_equal(tokens.long().numpy(), want)
        assert np.array_equal(b["input_ids"].long().numpy(), want[:, :-1])
        assert np.array_equal(b["labels"].long().numpy(), want[:, 1:])


def test_every_order_and_batch_shape_gathers_the_named_rows(pub, rows_by_shard, tmp_path):
    """Batches where rows share shards (sequential, window) and where every row has its own."""
    for order, batch in (("sequential", 8), ("window", 16), ("global", 2), ("sequential", 64)):
        for b in run(pub, tmp_path, steps=3, order=order, window_shards=2, global_batch=batch, token_dtype=None):
            shards, rows = samples_at(pub.manifest, "train", 0, order, b["indices"].numpy(), 2)
            want = np.stack([rows_by_shard[s][r] for s, r in zip(shards, rows)])
            assert np.array_equal(b["tokens"].numpy(), want), (order, batch)


def test_token_dtype_must_hold_the_stored_tokens(pub, tmp_path):
    for bad in (torch.int8, torch.uint8, torch.float32, torch.int16):
        with pytest.raises(ValueError, match="token_dtype"):
            Loader(pub.url, caching=Caching(dir=str(tmp_path)), batches=Batches(token_dtype=bad))


@pytest.mark.parametrize("token_dtype, want", [(None, np.uint16), ("int64", np.int64), (np.int32, np.int32)])
def test_numpy_batches_are_the_tensor_batches_as_numpy_arrays(pub, tmp_path, token_dtype, want):
    """Batches(numpy=True) (what `gristmill serve` assembles with, torch never imported): the same rows,
    indices and steps as the tensors, in the asked numpy dtype (the default token_dtype: int64)."""
    tensors = run(pub, tmp_path, steps=3, seed=3, token_dtype=torch.int64)
    arrays = run(pub, tmp_path, steps=3, seed=3, token_dtype=token_dtype, numpy=True)
    for t, a in zip(tensors, arrays):
        assert isinstance(a["tokens"], np.ndarray) and a["tokens"].dtype == want and a["step"] == t["step"]
        assert np.array_equal(a["tokens"], t["tokens"].numpy()) and np.array_equal(a["indices"], t["indices"].numpy())
        assert np.shares_memory(a["input_ids"], a["tokens"]) and np.array_equal(a["labels"], t["labels"].numpy())


def test_numpy_batches_refuse_pinned_memory_and_a_dtype_too_narrow(pub, tmp_path):
    with pytest.raises(ValueError, match="pin_memory=True needs torch tensors"):
        Batches(numpy=True, pin_memory=True)
    for bad in (np.uint8, np.int16, np.float32, torch.int64):
        with pytest.raises(ValueError, match="token_dtype"):
            Loader(pub.url, caching=Caching(dir=str(tmp_path)), batches=Batches(token_dtype=bad, numpy=True))


def test_released_pages_change_nothing_served(pub, tmp_path, monkeypatch):
    import gristmill.loader.loader as ll

    monkeypatch.setattr(ll, "MAPPED_CHECK_STEPS", 1)
    plain = run(pub, tmp_path / "a", steps=9, global_batch=8, mapped_limit_bytes=None)
    with Loader(pub.url, Sampling(global_batch=8), caching=Caching(dir=str(tmp_path / "b"), mapped_limit_bytes=1),
                threads=Threads(workers=0)) as ld:
        it = iter(ld)
        released = [next(it) for _ in range(9)]
        assert ld.page_releases >= 1 and ld.last_metrics["page_releases"] == ld.page_releases
    same(plain, released)


def test_mapped_pages_stay_under_the_limit(tmp_path, monkeypatch):
    """RSS of file-backed pages stays near the limit while a run reads far more shard bytes than it."""
    import gristmill.loader.loader as ll
    from helpers import build_dataset

    from gristmill.loader.residency import file_backed_resident

    assert file_backed_resident() is not None  # Linux: the limit works from /proc/self/statm
    monkeypatch.setattr(ll, "MAPPED_CHECK_STEPS", 1)
    pub = build_dataset(str(tmp_path / "data"), shard_rows=(256,) * 8, seq_len=2047)  # 8 shards of 1 MiB
    limit = 1 << 20
    with Loader(pub.url, Sampling(global_batch=16), caching=Caching(dir=str(tmp_path / "warm")),
                threads=Threads(workers=0)) as ld:
        next(iter(ld))  # libraries and compiled kernels mapped before measuring
    peaks = {}
    for name, mapped_limit in (("unbounded", None), ("bounded", limit)):
        with Loader(pub.url, Sampling(global_batch=16, epochs=1),
                    caching=Caching(dir=str(tmp_path / name), mapped_limit_bytes=mapped_limit),
                    threads=Threads(workers=0)) as ld:
            base, peak = file_backed_resident(), 0
            for _ in ld:
                peak = max(peak, file_backed_resident() - base)
            peaks[name] = peak
    assert peaks["unbounded"] > 4 * limit  # the run maps most of the 8 MiB it reads
    assert peaks["bounded"] < peaks["unbounded"] / 2


@pytest.mark.parametrize("order", ["global", "window"])
def test_determinism_across_world_sizes_and_worker_counts(pub, tmp_path, order):
    reference = run(pub, tmp_path / "ref", steps=5, order=order, window_shards=2, workers=1)
    for world_size in (2, 4):
        for workers in (0, 3):
            per_rank = [run(pub, tmp_path / f"ws{world_size}", steps=5, order=order, window_shards=2,
                            rank=r, world_size=world_size, workers=workers, fetch_workers=workers + 1)
                        for r in range(world_size)]
            for step in range(5):
                for k in ("input_ids", "labels", "indices"):
                    joined = torch.cat([per_rank[r][step][k] for r in range(world_size)])
                    assert torch.equal(joined, reference[step][k]), (world_size, workers, step, k)
                assert all(per_rank[r][step]["input_ids"].shape[0] == 8 // world_size for r in range(world_size))


def test_exact_resume_from_state_even_at_another_world_size(pub, tmp_path):
    straight = run(pub, tmp_path, steps=9, seed=1)
    with Loader(pub.url, Sampling(seed=1, global_batch=8), caching=Caching(dir=str(tmp_path))) as ld:
        first = take(ld, 4)
        state = ld.state_dict()
    assert state["next_index"] == 32 and state["manifest_sha256"] == pub.manifest.sha256
    with Loader(pub.url, Sampling(seed=1, global_batch=8), caching=Caching(dir=str(tmp_path))) as ld:
        ld.load_state_dict(state)
        rest = take(ld, 5)
    same(first + rest, straight)
    # Elastic: resume the same state on 2 ranks; together they serve the same samples.
    halves = []
    for r in range(2):
        with Loader(pub.url, Sampling(seed=1, global_batch=8, rank=r, world_size=2),
                    caching=Caching(dir=str(tmp_path))) as ld:
            ld.load_state_dict(state)
            halves.append(take(ld, 5))
    for step in range(5):
        assert torch.equal(torch.cat([halves[0][step]["input_ids"], halves[1][step]["input_ids"]]), rest[step]["input_ids"])


def test_load_state_dict_mid_iteration_restarts_from_the_new_index(pub, tmp_path):
    straight = run(pub, tmp_path, steps=6, seed=2)
    with Loader(pub.url, Sampling(seed=2, global_batch=8), caching=Caching(dir=str(tmp_path))) as ld:
        it = iter(ld)
        next(it), next(it), next(it)
        ld.load_state_dict({"next_index": 8})
        again = [next(it) for _ in range(5)]
    same(again, straight[1:6])


def test_start_index_and_resume_state_refuse_a_different_order(pub, tmp_path):
    straight = run(pub, tmp_path, steps=4, seed=4)
    same(run(pub, tmp_path, steps=2, seed=4, start_index=16), straight[2:4])
    with Loader(pub.url, Sampling(seed=4, global_batch=8), caching=Caching(dir=str(tmp_path))) as ld:
        with pytest.raises(ValueError, match="seed is 5 in the saved state but 4"):
            ld.load_state_dict({**ld.state_dict(), "seed": 5})
        with pytest.raises(ValueError, match="manifest_sha256"):
            ld.load_state_dict({**ld.state_dict(), "manifest_sha256": "0" * 64})


@pytest.mark.parametrize("order", ["global", "window", "sequential"])
def test_one_epoch_visits_every_row_exactly_once(pub, tmp_path, order):
    n = sum(s.rows for s in pub.manifest.shards_of("train"))  # 120 = 15 batches of 8
    with Loader(pub.url, Sampling(order=order, window_shards=2, global_batch=8, epochs=1),
                caching=Caching(dir=str(tmp_path))) as ld:
        batches = list(ld)
    assert len(batches) == n // 8
    seen = np.concatenate([b["input_ids"][:, :2].numpy() for b in batches])  # (shard + 1, row) markers
    assert len({tuple(x) for x in seen.tolist()}) == n


def test_validation_split_sequential_order(pub, rows_by_shard, tmp_path):
    with Loader(pub.url, Sampling(split="validation", order="sequential", global_batch=4, epochs=1),
                caching=Caching(dir=str(tmp_path))) as ld:
        batches = list(ld)
    val = [i for i, s in enumerate(pub.manifest.shards) if s.split == "validation"][0]
    got = np.concatenate([b["input_ids"].numpy() for b in batches])
    assert np.array_equal(got, rows_by_shard[val][:, :-1].astype(np.int64))


def test_metrics_count_hits_misses_and_bytes(pub, tmp_path):
    with Loader(pub.url, Sampling(global_batch=8), caching=Caching(dir=str(tmp_path))) as ld:
        metrics = []
        for batch in take_iter(ld, 4):
            metrics.append(dict(ld.last_metrics))
    train_bytes = sum(s.bytes for s in pub.manifest.shards_of("train"))
    assert sum(m["bytes_downloaded"] for m in metrics) == train_bytes
    assert sum(m["cache_misses"] for m in metrics) == 3
    assert all(m["input_wait_s"] >= 0 for m in metrics) and metrics[0]["step"] == 0
    with Loader(pub.url, Sampling(global_batch=8), caching=Caching(dir=str(tmp_path))) as ld:  # warm
        take(ld, 1)
        assert ld.last_metrics["cache_misses"] == 0 and ld.last_metrics["bytes_downloaded"] == 0
        assert ld.last_metrics["cache_hits"] >= 1


def take_iter(ld, steps):
    for i, b in enumerate(ld):
        yield b
        if i + 1 == steps:
            return


def test_a_corrupted_cached_shard_is_detected_and_fetched_again(pub, tmp_path):
    clean = run(pub, tmp_path / "clean", steps=6)
    cache = tmp_path / "cache"
    run(pub, cache, steps=6)
    cached = sorted(p for p in os.listdir(cache) if p.endswith(".arrow"))
    assert len(cached) == 3
    for name in cached:
        flip_byte(str(cache / name))
    with Loader(pub.url, Sampling(global_batch=8), caching=Caching(dir=str(cache))) as ld:
        again = []
        misses = 0
        for b in take_iter(ld, 6):
            again.append(b)
            misses += ld.last_metrics["cache_misses"]
    same(again, clean)
    assert misses == 3  # every corrupted shard was re-fetched
    from gristmill.manifests import sha256_file
    by_raw = {s.raw_sha256 for s in pub.manifest.shards}
    for name in cached:
        assert sha256_file(str(cache / name))[0] == name[: -len(".arrow")] and name[:-6] in by_raw


def test_a_remote_failing_30_percent_of_requests_yields_identical_batches(pub, tmp_path):
    clean = run(pub, tmp_path / "clean", steps=8, order="window", window_shards=1)
    opts = {"fail_rate": 0.3, "corrupt_rate": 0.1, "seed": 7}
    flaky = run(pub, tmp_path / "flaky", steps=8, order="window", window_shards=1, url=simulated_url(pub.url),
                storage_options=opts, retries=12, backoff_s=0.001)
    same(flaky, clean)
    fs = fsspec.filesystem("gmsim", **opts)
    assert fs.failures + fs.corruptions > 0 and fs.requests > 3


def test_a_shard_that_keeps_failing_stops_the_run_naming_it(tmp_path):
    bad = build_dataset(str(tmp_path / "ds"))
    victim = bad.manifest.shards[1]
    flip_byte(os.path.join(bad.url, victim.path))
    with Loader(bad.url, Sampling(global_batch=8, order="sequential"), source=Source(retries=2, backoff_s=0.0),
                caching=Caching(dir=str(tmp_path / "cache"))) as ld:
        with pytest.raises(ShardFetchError, match=f"shard {victim.path} .* failed 2 attempts.*sha256 mismatch"):
            list(take_iter(ld, 20))
    assert not [p for p in os.listdir(tmp_path / "cache") if p.startswith(victim.raw_sha256) and ".arrow" in p]


def test_cache_limit_is_respected_with_eviction(pub, tmp_path):
    shards = pub.manifest.shards_of("train")
    limit = sum(sorted(s.raw_bytes for s in shards)[-2:])  # two windows of one shard, not all three
    sizes = []
    with Loader(pub.url, Sampling(order="window", window_shards=1, global_batch=8, epochs=3),
                caching=Caching(dir=str(tmp_path), limit_bytes=limit), threads=Threads(prefetch=2)) as ld:
        downloaded = 0
        for _ in ld:
            sizes.append(ld.cache.cached_bytes())
            downloaded += ld.last_metrics["bytes_downloaded"]
    assert len(sizes) == 3 * 120 // 8
    assert max(sizes) <= limit
    assert downloaded > sum(s.bytes for s in shards)  # something was evicted and fetched again


def test_a_cache_limit_too_small_for_the_order_is_refused_at_start(pub, tmp_path):
    big = max(s.raw_bytes for s in pub.manifest.shards_of("train"))
    with pytest.raises(CacheTooSmallError, match=r"too small for order='window' \(window_shards=1\).*up to 2 shards"):
        Loader(pub.url, Sampling(order="window", window_shards=1, global_batch=8),
               caching=Caching(dir=str(tmp_path), limit_bytes=big), threads=Threads(prefetch=2))
    with pytest.raises(CacheTooSmallError, match="order='global'"):
        Loader(pub.url, Sampling(order="global", global_batch=8),
               caching=Caching(dir=str(tmp_path), limit_bytes=2 * big))


def test_the_manifest_hash_pin_is_enforced(pub, tmp_path):
    with pytest.raises(HashMismatchError, match="pinned by the caller"):
        Loader(pub.url, source=Source(expected_sha256="f" * 64), caching=Caching(dir=str(tmp_path)))
    assert run(pub, tmp_path, steps=1, expected_sha256=pub.manifest.sha256)[0]["step"] == 0


def test_ranks_sharing_a_cache_download_each_shard_once(pub, tmp_path):
    opts = {"latency_s": 0.02, "seed": 99}
    downloaded, errors = [], []

    def rank(r):
        try:
            with Loader(simulated_url(pub.url), Sampling(rank=r, world_size=4, global_batch=8),
                        source=Source(storage_options=opts), caching=Caching(dir=str(tmp_path))) as ld:
                for _ in take_iter(ld, 3):
                    downloaded.append(ld.last_metrics["bytes_downloaded"])
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    # Every rank needs all three shards in three steps, yet each crossed the network once.
    assert sum(downloaded) == sum(s.bytes for s in pub.manifest.shards_of("train"))


def test_bad_configuration_is_refused_with_the_value(pub, tmp_path):
    with pytest.raises(ValueError, match="global_batch 10 is not divisible by world_size 4"):
        Loader(pub.url, Sampling(global_batch=10, world_size=4), caching=Caching(dir=str(tmp_path)))
    with pytest.raises(ValueError, match="rank 4 is outside world_size 4"):
        Loader(pub.url, Sampling(global_batch=8, rank=4, world_size=4), caching=Caching(dir=str(tmp_path)))


def test_manifest_through_fsspec_url_and_published_object(pub, tmp_path):
    a = run(pub, tmp_path, steps=2, url=join("file://" + pub.url))
    b = run(pub, tmp_path, steps=2, url=pub)
    same(a, b)


def test_temporary_files_of_dead_processes_are_removed(pub, tmp_path):
    dead = 2 ** 22 + 12345  # above the default pid_max: no such process
    orphan = tmp_path / f"{'a' * 64}.arrow.tmp-{dead}-1"
    live = tmp_path / f"{'b' * 64}.arrow.tmp-{os.getpid()}-1"
    orphan.write_bytes(b"x" * 10)
    live.write_bytes(b"x" * 10)
    Loader(pub.url, caching=Caching(dir=str(tmp_path))).close()
    assert not orphan.exists() and live.exists()


def test_reads_a_dataset_published_to_memory_fs(tmp_path):
    from gristmill.manifests import ManifestStore

    local = build_dataset(str(tmp_path / "ds"), publish=False)  # staging dir + manifest
    pub_mem = ManifestStore("memory://gristmill-loader-test").publish(local.manifest, local.url)
    pub_disk = ManifestStore(str(tmp_path / "store")).publish(local.manifest, local.url)
    same(run(pub_mem, tmp_path / "c1", steps=3, url=pub_mem.url), run(pub_disk, tmp_path / "c2", steps=3))


CHILD = """
import json, sys
from gristmill.loader import Caching, Loader, Sampling, Source
from gristmill.manifests.storage import register_simulated_store
register_simulated_store()
url, cache, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
total = 0
with Loader(url, Sampling(rank=rank, world_size=2, global_batch=8), source=Source(storage_options={"latency_s": 0.05}),
            caching=Caching(dir=cache)) as ld:
    for i, _ in enumerate(ld):
        total += ld.last_metrics["bytes_downloaded"]
        if i == 2:
            break
print(json.dumps(total))
"""


@pytest.mark.slow
def test_processes_sharing_a_cache_download_each_shard_once(pub, tmp_path):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, simulated_url(pub.url), str(tmp_path), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert sum(int(o[0].strip().splitlines()[-1]) for o in outs) == sum(s.bytes for s in pub.manifest.shards_of("train"))


@pytest.mark.parametrize("order", ["global", "window"])
def test_a_batch_straddling_an_epoch_boundary_is_the_same_at_any_world_size(pub, rows_by_shard, tmp_path, order):
    # 120 train rows: the batch at 112 covers the last 8 rows of epoch 0 and the first 8 of epoch 1.
    one = run(pub, tmp_path, steps=2, order=order, window_shards=2, global_batch=16, start_index=96)
    four = [run(pub, tmp_path, steps=2, order=order, window_shards=2, global_batch=16, start_index=96,
                rank=r, world_size=4) for r in range(4)]
    for step in range(2):
        assert torch.equal(torch.cat([four[r][step]["input_ids"] for r in range(4)]), one[step]["input_ids"])
    assert one[1]["indices"].tolist() == list(range(112, 128))
    shards, rows = samples_at(pub.manifest, "train", 0, order, np.arange(112, 128), window=2)
    want = np.stack([rows_by_shard[s][r] for s, r in zip(shards, rows)]).astype(np.int64)
    assert np.array_equal(one[1]["labels"].numpy(), want[:, 1:])


def test_importing_the_loader_registers_no_simulated_store():
    """gmsim:// (latency, failures, corruption) is test and bench scaffolding: a process that only
    imports and uses the loader must not resolve it."""
    import subprocess
    import sys

    probe = ("from fsspec.registry import known_implementations, registry\n"
             "import gristmill.loader\n"
             "from gristmill.loader import Loader\n"
             "assert 'gmsim' not in registry and 'gmsim' not in known_implementations\n"
             "from gristmill.manifests.storage import register_simulated_store\n"
             "register_simulated_store()\n"
             "assert 'gmsim' in registry\n"
             "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_flat_options_map_to_the_loaders_sections():
    """GristmillDataset and the bench take flat option names; each lands in its section, and an
    unknown one is refused as a bad keyword would be."""
    from gristmill.loader.options import sections

    got = sections(seed=3, cache_dir="/c", cache_limit_bytes=5, workers=0, documents=True, retries=1)
    assert got == {"sampling": Sampling(seed=3), "source": Source(retries=1), "caching": Caching(dir="/c", limit_bytes=5),
                   "threads": Threads(workers=0), "batches": Batches(documents=True)}
    with pytest.raises(TypeError, match="unknown Loader option 'dir'"):
        sections(dir="/c")  # a section's own field name is not a flat option


def test_a_section_refuses_a_bad_value_where_it_is_written():
    from gristmill.errors import UsageError

    with pytest.raises(UsageError, match="global_batch 10 is not divisible by world_size 4"):
        Sampling(global_batch=10, world_size=4)
    with pytest.raises(UsageError, match="prefetch and fetch_workers must be >= 1"):
        Threads(prefetch=0)
    with pytest.raises(UsageError, match="mapped_limit_bytes must be None"):
        Caching(mapped_limit_bytes=0)
