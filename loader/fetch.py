"""Fetching and verifying shards into the cache directory, once per node.

A shard is downloaded whole into memory, checked against the manifest's ``sha256`` and ``bytes``
and against what the manifest states about its contents (schema, token dtype, seq_len + 1 tokens
per row, row count), decompressed, written under a temporary name, checked against
``raw_sha256`` and ``raw_bytes`` and only then renamed into place. A cached file serves a shard
only where a verified download linked that shard's published ``sha256`` to it (the ``.src-``
marker): a manifest stating another shard's cache facts gets its own file fetched and refused,
never the other shard's rows. A cached file found on disk is re-hashed once per process before
first use: a flipped byte on the NVMe is caught, the file deleted and the shard fetched again.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from typing import Sequence

import pyarrow as pa

from gristmill.manifests import (FactMismatchError, HashMismatchError, ManifestError, Published, Shard, checked_rows,
                                 join, sha256_bytes, sha256_file)
from gristmill.manifests.shards import read_table, write_shard
from gristmill.manifests.storage import Store, split_url

from .cache_files import flock, lock_path, shard_path, stat, unlink, unlock
from .disk_lru import DiskLRU
from .errors import CacheFullError, ShardFetchError

log = logging.getLogger(__name__)


class ShardFetcher:
    """Fetches each shard from, and checks it against, the manifest that lists it (``sources``:
    one dataset, or a mixture's components)."""

    def __init__(self, cache_dir: str, sources: Sequence[Published], space: DiskLRU, *,
                 storage_options: dict | None = None, retries: int = 5, backoff_s: float = 0.2):
        self.dir, self.space, self.retries, self.backoff_s = cache_dir, space, retries, backoff_s
        base_url = sources[0].url
        # Cached shards are named by content, so two sources may list the same one; it is fetched
        # from one of them with THAT source's facts (path, sha256, bytes), never a mix of two.
        self._source = {s.raw_sha256: (p, s) for p in reversed(sources) for s in p.manifest.shards}
        check_one_file_per_cache_form(sources)
        # The options are the first source's store's; a component on another protocol opens its own with none.
        store = Store.from_url(base_url, **(storage_options or {}))
        self._stores = {p.url: store if _protocol(p.url) == _protocol(base_url) else Store.from_url(p.url) for p in sources}
        self._verified: set[tuple] = set()  # (raw_sha256, sha256, inode, size, mtime_ns) hashed by this process

    def source(self, raw_sha256: str) -> tuple[Published, Shard]:
        """The manifest a cache form is fetched from, and its shard as that manifest states it."""
        return self._source[raw_sha256]

    def _linked(self, shard: Shard) -> bool:
        return os.path.exists(lock_path(self.dir, shard, f"src-{shard.sha256}"))

    def verify(self, shard: Shard, path: str, st: os.stat_result) -> bool:
        """The cached file at ``path`` is this shard's (linked by a verified download, and its hash holds)."""
        key = (shard.raw_sha256, shard.sha256, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._verified:
            return True
        if not self._linked(shard):  # the cached file may be another shard's: fetch this one's own file
            log.info("cached form of shard %s was never verified as its published file's; fetching it", shard.path)
            return False
        ok = st.st_size == shard.raw_bytes and sha256_file(path)[0] == shard.raw_sha256
        if ok:
            self._verified.add(key)
        else:
            log.warning("cached shard %s (%s) fails its raw_sha256 check; fetching it again", shard.path, path)
        return ok

    def download(self, shard: Shard) -> int:
        """Fetch, verify and install one shard, once per node (the .dl lock); returns bytes fetched."""
        pub, shard = self._source[shard.raw_sha256]
        path, url = shard_path(self.dir, shard), join(pub.url, shard.path)
        fd = flock(lock_path(self.dir, shard, "dl"), fcntl.LOCK_EX)
        try:
            st = stat(path)  # another process may have installed it while we waited
            if st is not None and self.verify(shard, path, st):
                return 0
            if st is not None and not (st.st_size == shard.raw_bytes and sha256_file(path)[0] == shard.raw_sha256):
                unlink(path)  # damaged; a sound file (another shard's, or unlinked) is replaced by the fetch
            last = None
            for attempt in range(self.retries):
                try:
                    n = self._fetch_once(shard, url, path)
                    st = stat(path)
                    with open(lock_path(self.dir, shard, f"src-{shard.sha256}"), "wb"):
                        pass  # the link published file -> cache form, proved by this download
                    self._verified.add((shard.raw_sha256, shard.sha256, st.st_ino, st.st_size, st.st_mtime_ns))
                    return n
                except (CacheFullError, FactMismatchError):  # it already waited / the manifest is wrong: final
                    raise
                except (OSError, ManifestError) as err:
                    last = err
                    delay = min(self.backoff_s * 2 ** attempt, 10.0)
                    log.warning("fetching shard %s failed (attempt %d of %d): %s; retrying in %.2fs",
                                shard.path, attempt + 1, self.retries, err, delay)
                    if attempt + 1 < self.retries:
                        time.sleep(delay)
            raise ShardFetchError(f"shard {shard.path} ({url}) failed {self.retries} attempts to fetch and verify; "
                                  f"last error: {last}") from last
        finally:
            unlock(fd)

    def _fetch_once(self, shard: Shard, url: str, path: str) -> int:
        pub, _ = self._source[shard.raw_sha256]
        data = self._stores[pub.url].read(url)
        actual = sha256_bytes(data)
        if actual != shard.sha256:
            raise HashMismatchError(f"shard {shard.path} as downloaded from {url}", shard.sha256, actual)
        # The bytes are the pinned ones from here on: a mismatch below is the manifest's, not the network's.
        if len(data) != shard.bytes:
            raise FactMismatchError(shard.path, "bytes", shard.bytes, len(data))
        rows = checked_rows(read_table(pa.py_buffer(data)), pub.manifest, shard)
        self.space.reserve(shard.raw_bytes)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            stats = write_shard(tmp, rows, compressed=False)
            if stats.sha256 != shard.raw_sha256:  # the published bytes were the pinned ones: the manifest is wrong
                raise FactMismatchError(f"{shard.path} (its uncompressed cache form)", "raw_sha256", shard.raw_sha256,
                                        stats.sha256)
            if stats.bytes != shard.raw_bytes:
                raise FactMismatchError(shard.path, "raw_bytes", shard.raw_bytes, stats.bytes)
            os.replace(tmp, path)
        finally:
            unlink(tmp)
            self.space.unreserve(shard.raw_bytes)
        return len(data)


def check_one_file_per_cache_form(sources: Sequence[Published]) -> None:
    """Shards with the same cache form (``raw_sha256``) hold the same rows, so they state the same
    published file (the writer is deterministic); one that states another's cache form is refused."""
    seen: dict[str, tuple] = {}
    for p in sources:
        for i, s in enumerate(p.manifest.shards):
            facts = (s.sha256, s.bytes, s.raw_bytes, s.rows)
            where, first = seen.setdefault(s.raw_sha256, (f"{p.url} shards[{i}] ({s.path})", facts))
            if first != facts:
                raise ManifestError(f"{p.url} shards[{i}] ({s.path}): states the cache form (raw_sha256 {s.raw_sha256}) "
                                    f"of {where}, but another published file (sha256, bytes, raw_bytes, rows {facts} vs "
                                    f"{first}): one shard states another's cache facts; run `gristmill manifest verify`")


def _protocol(url: str) -> str:
    return split_url(url)[0] or "file"
