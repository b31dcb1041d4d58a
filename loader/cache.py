"""The local shard cache: verified downloads, shared by the ranks of a node, LRU under a limit.

``ShardCache`` puts four units together (``cache_files.py`` has the directory's layout):

* ``fetch.ShardFetcher``: fetch and verify a shard into the directory, once per node;
* ``disk_lru.DiskLRU``: the directory under ``limit_bytes``, evicting unpinned shards, least
  recently used first, across every process on the node;
* ``pins.PinTable``: which shards this process uses and where their rows are mapped;
* ``residency.PageResidency``: the mapped pages counted in this process's RSS, under a limit.

Files are named by the content hash of the cache form, so two datasets that share a shard
share its cache entry and nothing is ever confused with a stale copy; the shards listed to one
cache that state the same cache form must state the same published file (else a
``ManifestError`` at construction). Every mapping is checked against the manifest's facts
before a row is read through it, and its token ids are scanned once per process against
``vocab_size``: a manifest with a valid hash but wrong facts is refused (``FactMismatchError``,
never retried).
"""
from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gristmill.errors import UsageError
from gristmill.manifests import MappedShard, Published, Shard, check_vocab

from .cache_files import cached_bytes, flock, lock_path, remove_orphans, shard_path, stat, touch, unlock
from .disk_lru import DiskLRU
from .errors import CacheError, CacheFullError, ShardFetchError
from .fetch import ShardFetcher
from .pins import PinTable
from .residency import PageResidency, dontneed, file_pages

__all__ = ["CacheError", "CacheFullError", "FetchResult", "ShardCache", "ShardFetchError"]


@dataclass
class FetchResult:
    downloaded_bytes: int  # 0 when the shard was already cached (a hit)


class ShardCache:
    """The shards of one published manifest (``published``: its URL and the facts its shards are checked
    against), or of several (a mixture's components): each shard is fetched from, and checked against,
    the manifest that lists it."""

    def __init__(self, cache_dir: str, published: Published | Sequence[Published], *,
                 storage_options: dict | None = None, limit_bytes: int | None = None, retries: int = 5, backoff_s: float = 0.2,
                 max_open: int = 64, full_timeout_s: float = 60.0, mapped_limit_bytes: int | None = None):
        if limit_bytes is not None and limit_bytes <= 0:
            raise UsageError(f"cache_limit_bytes must be positive or None, got {limit_bytes}")
        if retries < 1:
            raise UsageError(f"retries must be >= 1, got {retries}")
        os.makedirs(cache_dir, exist_ok=True)
        sources = (published,) if isinstance(published, Published) else tuple(published)
        self.dir, self.base_url, self.manifest = cache_dir, sources[0].url, sources[0].manifest
        self.limit_bytes, self.mapped_limit_bytes = limit_bytes, mapped_limit_bytes
        self.pins = PinTable(max_open)
        self.space = DiskLRU(cache_dir, limit_bytes, self.pins, full_timeout_s)
        self.fetcher = ShardFetcher(cache_dir, sources, self.space, storage_options=storage_options, retries=retries,
                                    backoff_s=backoff_s)
        self.residency = PageResidency(self.pins, mapped_limit_bytes)
        self._in_vocab: set[str] = set()  # raw_sha256 of the shards whose token ids were scanned (same content)
        remove_orphans(cache_dir)

    # -- paths and sizes ----------------------------------------------------------------------
    def path(self, shard: Shard) -> str:
        return shard_path(self.dir, shard)

    def cached_bytes(self) -> int:
        """Bytes of complete cache files in the directory (what the limit bounds)."""
        return cached_bytes(self.dir)

    # -- pins (called by the loader's planner, before any thread touches the shard) -------------
    def ids(self, shards: list[Shard]) -> np.ndarray:
        """The entry id of each shard (shards with the same cache form share one), for the ``*_ids`` methods."""
        return self.pins.ids(shards)

    def pin_ids(self, ids: np.ndarray) -> np.ndarray:
        """Count one more user of each entry (``ids`` distinct); returns the ids not usable yet (each needs ``ensure``)."""
        return self.pins.pin_ids(ids)

    def unpin_ids(self, ids: np.ndarray) -> None:
        self.pins.unpin_ids(ids)

    def bounds(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each entry's rows as addresses ``[start, end)`` (C-contiguous rows; 0, 0 when not mapped);
        valid while it stays pinned."""
        return self.pins.bounds(ids)

    def rows(self, shards: list[Shard]) -> list[np.ndarray]:
        """Each shard's ``(rows, seq_len + 1)`` memory-mapped view; the shards must be pinned and ensured."""
        return self.pins.rows(shards)

    # -- page residency -------------------------------------------------------------------------
    @property
    def page_releases(self) -> int:
        """Times ``bound_mapped_pages`` released every mapping's pages."""
        return self.residency.releases

    def release_pages(self) -> None:
        """Unmap the resident pages of every open mapping (``MADV_DONTNEED``) without closing it."""
        self.residency.release_all()

    def bound_mapped_pages(self) -> None:
        """Keep the shard pages mapped into this process under ``mapped_limit_bytes``."""
        self.residency.bound()

    # -- ensure: the shard is on disk, verified, pinned across processes and mapped -------------
    def ensure(self, shard: Shard) -> FetchResult:
        """Make a pinned shard usable; blocking (runs in a fetch thread)."""
        e = self.pins.use(shard.raw_sha256)
        if e.pin_fd is None:
            fd = flock(lock_path(self.dir, shard, "pin"), fcntl.LOCK_SH)
            with self.pins.lock:
                if e.pin_fd is None:
                    e.pin_fd = fd
                else:
                    unlock(fd)
        path = self.path(shard)
        st = stat(path)
        if st is not None and e.mapped is not None and st.st_ino == e.inode:
            touch(path)
            return FetchResult(0)
        downloaded = 0
        if st is None or not self.fetcher.verify(shard, path, st):
            downloaded = self.fetcher.download(shard)
            st = os.stat(path)
        pub, shard = self.fetcher.source(shard.raw_sha256)
        manifest = pub.manifest
        mapped = MappedShard(path, manifest, shard)  # mapped while pinned: nobody can evict it in between
        if shard.raw_sha256 not in self._in_vocab:  # a full read, once per shard per process (memory speed)
            try:
                check_vocab(mapped.rows, manifest, shard)
            except BaseException:
                mapped.close()
                raise
            self._in_vocab.add(shard.raw_sha256)
        pages = file_pages(mapped)
        with self.pins.lock:
            self.pins.install_locked(e, mapped, st.st_ino, pages)
            if self.mapped_limit_bytes is not None and pages is not None:  # what reading the Arrow footer mapped
                dontneed(pages)
        touch(path)
        return FetchResult(downloaded)

    def close(self) -> None:
        self.pins.close()
