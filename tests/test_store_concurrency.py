"""Publishing under concurrency, on a local disk and on S3 (the local moto server, tests/s3server.py).

Twenty publishers of the same dataset at once, as threads and as processes: every one gets its
own version, every committed version verifies, and nothing of one publisher is inside another's
version (the primitives it rests on: tests/test_storage.py).
"""
from __future__ import annotations

import multiprocessing
import os
import posixpath
import threading
import time

import fsspec
import pytest

from gristmill.manifests import ManifestStore, VersionExistsError, read_rows, verify_published
from gristmill.manifests.store import CLAIM_FILE, MANIFEST_FILE
from gristmill.manifests.synthetic import build_synthetic

PUBLISHERS = 20


def _staged(root: str, n: int) -> list:
    """``n`` different versions of dataset "race": every shard and every document index differs."""
    return [build_synthetic(os.path.join(root, f"src-{i}"), dataset="race", seed=i, shard_rows=(6 + i, 4), val_rows=(3,),
                            publish=False) for i in range(n)]


def _publish_one(store_url: str, staged, env: dict, barrier) -> tuple[int, str]:
    os.environ.update(env)
    barrier.wait()  # all at once: the race the claim must decide
    pub = ManifestStore(store_url).publish(staged.manifest, staged.url)
    return pub.manifest.version, pub.manifest.sha256


def _hold_the_window_open(entered) -> None:
    """In a publisher process: open, every time, the window that made 1 in 6 S3 races publish the
    same content twice (issue 39). A waiter for v1 finds no v1/manifest.json, reads v1's claim and
    asks whether its writer lives; v1's writer commits and exits in between, so the waiter takes it
    for dead and publishes v2. Here the waiter's question waits (``entered`` set) until that writer
    has exited, and the writer's commit waits until a waiter is in the window."""
    import gristmill.manifests.store as ms

    real_alive, real_put = ms._alive, ms._put_new_or_own

    def alive(claim: dict) -> bool:
        entered.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(int(claim["pid"]), 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        return real_alive(claim)

    def put_new_or_own(store, path, data):
        if path.endswith("/" + MANIFEST_FILE):
            entered.wait(60)
        return real_put(store, path, data)

    ms._alive, ms._put_new_or_own = alive, put_new_or_own


def _proc_main(store_url, staged, env, barrier, results, i, window=None):
    if window is not None:
        _hold_the_window_open(window)
    results[i] = _publish_one(store_url, staged, env, barrier)


def _check_store(store_url: str, staged: list, results: list) -> None:
    store = ManifestStore(store_url)
    versions = [v for v, _ in results]
    assert sorted(versions) == list(range(1, PUBLISHERS + 1)), versions  # distinct: nobody shared a number
    assert store.versions("race") == list(range(1, PUBLISHERS + 1))
    assert store.latest("race") == PUBLISHERS
    by_sha = {s.manifest.sha256: s.manifest for s in staged}
    assert len(by_sha) == PUBLISHERS
    fs, root = fsspec.core.url_to_fs(store_url)
    for version, sha in results:
        pub = store.load("race", version)
        assert pub.manifest.sha256 == sha  # the version holds the manifest of the publisher that was told it got it
        assert verify_published(pub) == []  # every pinned file is that publisher's (hash, facts, spans)
        vdir = posixpath.join(root, "race", f"v{version}")
        held = {posixpath.relpath(p, vdir) for p in fs.find(vdir)}
        pinned = {by_sha[sha].tokenizer.path, by_sha[sha].doc_index.path, *(s.path for s in by_sha[sha].shards)}
        assert held == pinned | {MANIFEST_FILE, CLAIM_FILE}  # nothing else: no other publisher's file, no temp file


def _race_threads(store_url: str, staged: list) -> list:
    barrier = threading.Barrier(len(staged))
    results: list = [None] * len(staged)

    def run(i):
        results[i] = _publish_one(store_url, staged[i], {}, barrier)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(staged))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def _race_processes(store_url: str, staged: list, env: dict, window: bool = False) -> list:
    """``window``: every publisher holds open the window between a waiter's look for an earlier
    version's manifest and its question whether that version's writer lives (``_hold_the_window_open``)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["gristmill.manifests", "s3fs"])
    barrier, manager = ctx.Barrier(len(staged)), ctx.Manager()
    try:
        results = manager.list([None] * len(staged))
        entered = manager.Event() if window else None
        procs = [ctx.Process(target=_proc_main, args=(store_url, staged[i], env, barrier, results, i, entered))
                 for i in range(len(staged))]
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
        assert [p.exitcode for p in procs] == [0] * len(staged)
        return list(results)
    finally:
        manager.shutdown()


@pytest.mark.parametrize("how", ["threads", "processes"])
def test_concurrent_publishers_local(tmp_path, how):
    staged = _staged(str(tmp_path), PUBLISHERS)
    store = str(tmp_path / "store")
    results = _race_threads(store, staged) if how == "threads" else _race_processes(store, staged, {})
    _check_store(store, staged, results)


@pytest.mark.slow  # 20 publishers through the local S3 server: ~27 s
@pytest.mark.parametrize("how", ["threads", "processes"])
def test_concurrent_publishers_s3(tmp_path, s3, s3_server, how):
    staged = _staged(str(tmp_path), PUBLISHERS)
    store = f"{s3}/store"
    results = _race_threads(store, staged) if how == "threads" else _race_processes(store, staged, s3_server.env)
    _check_store(store, staged, results)


@pytest.mark.parametrize("where,how", [("local", "threads"), ("local", "processes"), ("s3", "threads"),
                                       ("s3", "processes")])
def test_concurrent_publishers_of_the_same_content_publish_it_once(tmp_path, request, where, how):
    """Eight publishers of one manifest at once (two prepares of the same job, on one disk or one
    bucket): one version, which every publisher is told it got; no second number is left claimed.
    As processes, with the window that made it flaky held open every time (``_hold_the_window_open``)."""
    (staged,) = _staged(str(tmp_path), 1)
    store = str(tmp_path / "store") if where == "local" else f"{request.getfixturevalue('s3')}/store"
    env = request.getfixturevalue("s3_server").env if where == "s3" else {}
    results = (_race_threads if how == "threads" else lambda u, s: _race_processes(u, s, env, window=True))(store, [staged] * 8)
    assert results == [(1, staged.manifest.sha256)] * 8
    published = ManifestStore(store)
    assert published.versions("race") == [1] and published.latest("race") == 1
    assert published._taken(published._root_path + "/race") == [1]  # the losers released their claims
    assert verify_published(published.load("race")) == []


def test_s3_store_readers(tmp_path, s3):
    """A store on s3:// reads like a local one: load, latest, verify, the document index, the loader."""
    from gristmill.loader import Caching, Loader, Sampling
    from gristmill.manifests.doc_index import read_published_doc_index
    from gristmill.manifests.mixture import load_data

    staged = _staged(str(tmp_path), 2)
    store = ManifestStore(f"{s3}/store")
    first = store.publish(staged[0].manifest, staged[0].url)
    assert store.publish(staged[0].manifest, staged[0].url).url == first.url  # idempotent on content
    second = store.publish(staged[1].manifest, staged[1].url)
    assert (first.manifest.version, second.manifest.version, store.latest("race")) == (1, 2, 2)
    assert store.datasets() == ["race"]
    pub = load_data(f"{s3}/store/race")
    assert pub.manifest.sha256 == staged[1].manifest.sha256 and pub.url == f"{s3}/store/race/v2"
    assert verify_published(pub) == []
    assert read_published_doc_index(pub).num_rows == staged[1].manifest.doc_index.rows
    with Loader(pub.url, Sampling(global_batch=4, seed=1), caching=Caching(dir=str(tmp_path / "cache"))) as ld:
        tokens = next(iter(ld))["tokens"].numpy()
    train = {tuple(r) for s in staged[1].manifest.shards if s.split == "train"
             for r in read_rows(os.path.join(staged[1].url, s.path)).tolist()}
    assert tokens.shape == (4, 17) and all(tuple(r) in train for r in tokens.tolist())  # rows served from S3


def test_explicit_version_and_abandoned_claim(tmp_path):
    """A claimed number is never reused: not by an explicit version, not after its publisher died."""
    staged = _staged(str(tmp_path), 3)
    store = ManifestStore(str(tmp_path / "store"))
    store.publish(staged[0].manifest, staged[0].url, version=1)
    with pytest.raises(VersionExistsError, match="already published"):
        store.publish(staged[1].manifest, staged[1].url, version=1)
    # A publisher that claimed v2 and died before its manifest: v2 is not a version, and not reused.
    assert store.storage.put_new(str(tmp_path / "store" / "race" / "v2" / CLAIM_FILE), b"{}")
    with pytest.raises(VersionExistsError, match="already claimed"):
        store.publish(staged[1].manifest, staged[1].url, version=2)
    pub = store.publish(staged[1].manifest, staged[1].url)
    assert pub.manifest.version == 3 and store.versions("race") == [1, 3] and store.latest("race") == 3
