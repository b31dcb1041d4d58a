"""The cache directory under a byte limit: room is reserved before a shard is written, by
evicting least-recently-used unpinned shards (atime, shared by every process on the node).

Pins are ``flock`` shared locks, so they hold across processes: eviction takes a non-blocking
exclusive lock and skips any shard some process has pinned (an in-flight or prefetched batch
needs it). Deleting a file another process has memory-mapped is safe on POSIX: its mapping
stays valid until it is closed.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time

from .cache_files import EVICT_LOCK, SUFFIX, cached_bytes, flock, unlink, unlock
from .errors import CacheFullError
from .pins import PinTable

log = logging.getLogger(__name__)


class DiskLRU:
    def __init__(self, cache_dir: str, limit_bytes: int | None, pins: PinTable, full_timeout_s: float = 60.0):
        self.dir, self.limit_bytes, self.pins, self.full_timeout_s = cache_dir, limit_bytes, pins, full_timeout_s
        self.reserved = 0  # bytes of downloads in progress in this process, not yet on disk (under pins.lock)

    def reserve(self, need: int) -> None:
        """Reserve ``need`` bytes, evicting least-recently-used unpinned shards as required."""
        if self.limit_bytes is None:
            with self.pins.lock:
                self.reserved += need
            return
        deadline = time.monotonic() + self.full_timeout_s
        while True:
            fd = flock(os.path.join(self.dir, EVICT_LOCK), fcntl.LOCK_EX)
            try:
                with self.pins.lock:
                    reserved = self.reserved
                used = cached_bytes(self.dir) + reserved
                if used + need <= self.limit_bytes or self.evict(used + need - self.limit_bytes) >= used + need - self.limit_bytes:
                    with self.pins.lock:
                        self.reserved += need
                    return
            finally:
                unlock(fd)
            if time.monotonic() > deadline:
                raise CacheFullError(
                    f"cache {self.dir}: limit {self.limit_bytes:,} bytes cannot hold {need:,} more bytes: every cached "
                    f"shard is pinned (by this or another process sharing the cache) for {self.full_timeout_s:g}s; "
                    f"raise cache_limit_bytes or lower prefetch")
            time.sleep(0.05)  # another rank will unpin soon

    def unreserve(self, need: int) -> None:
        """The reserved bytes are on disk now (or the download failed)."""
        with self.pins.lock:
            self.reserved -= need

    def evict(self, to_free: int) -> int:
        """Delete unpinned cache files, least recently used first, until ``to_free`` bytes are gone."""
        candidates = []
        with os.scandir(self.dir) as it:
            for de in it:
                if de.name.endswith(SUFFIX):
                    try:
                        st = de.stat()
                    except FileNotFoundError:
                        continue
                    candidates.append((st.st_atime_ns, de.name[: -len(SUFFIX)], st.st_size))
        with self.pins.lock:
            candidates.sort(key=lambda c: self.pins.eviction_rank_locked(c[1], c[0]))
        freed = 0
        for _, name, size in candidates:
            if freed >= to_free:
                break
            with self.pins.lock:
                if self.pins.pinned_locked(name):
                    continue
                self.pins.release_locked(name)  # idle here: drop our own mapping and shared lock first
            try:  # another process pinning it holds LOCK_SH: skip it
                fd = flock(os.path.join(self.dir, f"{name}.pin"), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            try:
                unlink(os.path.join(self.dir, f"{name}{SUFFIX}"))
                freed += size
                log.debug("evicted %s%s (%d bytes)", name, SUFFIX, size)
            finally:
                unlock(fd)
        return freed
