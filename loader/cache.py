"""The local shard cache: verified downloads, shared by the ranks of a node, LRU under a limit.

Layout of ``cache_dir`` (meant for local NVMe)::

    <raw_sha256>.arrow   the uncompressed, memory-mappable cache form of a shard
    <raw_sha256>.dl      download lock: one process per node downloads a shard
    <raw_sha256>.pin     pin lock: every process using a shard holds it shared
    .evict               eviction lock: one process at a time frees space

Files are named by the content hash of the cache form, so two datasets that share a shard
share its cache entry and nothing is ever confused with a stale copy. A shard is downloaded
whole into memory, checked against the manifest's ``sha256``, decompressed, written under a
temporary name, checked against ``raw_sha256`` and only then renamed into place. A cached file
found on disk is re-hashed once per process before first use: a flipped byte on the NVMe is
caught, the file deleted and the shard fetched again.

Pins are ``flock`` shared locks, so they hold across processes: eviction takes a non-blocking
exclusive lock and skips any shard some process has pinned (an in-flight or prefetched batch
needs it). Deleting a file another process has memory-mapped is safe on POSIX: its mapping
stays valid until it is closed.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa

from manifests import HashMismatchError, ManifestError, MappedShard, Shard, join, sha256_bytes, sha256_file
from manifests.shards import read_table, rows_from_table, write_shard

log = logging.getLogger(__name__)


class ShardFetchError(ManifestError):
    """A shard could not be fetched and verified after every retry."""


class CacheFullError(ManifestError):
    """No unpinned shard is left to evict and the limit would be exceeded."""


@dataclass
class FetchResult:
    downloaded_bytes: int  # 0 when the shard was already cached (a hit)


def _flock(path: str, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


class _Entry:
    """One shard as this process sees it: its pin count, pin lock and mapping."""

    __slots__ = ("refs", "pin_fd", "mapped", "inode", "last_use")

    def __init__(self):
        self.refs, self.pin_fd, self.mapped, self.inode, self.last_use = 0, None, None, None, 0


class ShardCache:
    def __init__(self, cache_dir: str, base_url: str, *, storage_options: dict | None = None,
                 limit_bytes: int | None = None, retries: int = 5, backoff_s: float = 0.2,
                 max_open: int = 64, full_timeout_s: float = 60.0):
        if limit_bytes is not None and limit_bytes <= 0:
            raise ValueError(f"cache_limit_bytes must be positive or None, got {limit_bytes}")
        if retries < 1:
            raise ValueError(f"retries must be >= 1, got {retries}")
        os.makedirs(cache_dir, exist_ok=True)
        self.dir, self.base_url = cache_dir, base_url
        self.fs = fsspec.core.url_to_fs(base_url, **(storage_options or {}))[0]
        self.limit_bytes, self.retries, self.backoff_s = limit_bytes, retries, backoff_s
        self.max_open, self.full_timeout_s = max_open, full_timeout_s
        self._lock = threading.Lock()  # guards _entries, _reserved, _clock
        self._entries: dict[str, _Entry] = {}
        self._reserved = 0  # bytes of downloads in progress in this process, not yet on disk
        self._clock = 0
        self._open = 0  # entries with a mapping (pinned or idle)
        self._verified: set[tuple] = set()  # (name, inode, size, mtime_ns) hashed by this process
        self._remove_orphans()

    def _remove_orphans(self) -> None:
        """Delete temporary files left by dead processes (a crash mid-download), so they never fill the disk."""
        with os.scandir(self.dir) as it:
            for de in it:
                if ".arrow.tmp-" not in de.name:
                    continue
                pid = de.name.split(".arrow.tmp-", 1)[1].split("-", 1)[0]
                if pid.isdigit() and not _alive(int(pid)):
                    _unlink(de.path)

    # -- paths ---------------------------------------------------------------------------
    def path(self, shard: Shard) -> str:
        return os.path.join(self.dir, f"{shard.raw_sha256}.arrow")

    def _lock_path(self, shard: Shard, kind: str) -> str:
        return os.path.join(self.dir, f"{shard.raw_sha256}.{kind}")

    def cached_bytes(self) -> int:
        """Bytes of complete cache files in the directory (what the limit bounds)."""
        total = 0
        with os.scandir(self.dir) as it:
            for e in it:
                if e.name.endswith(".arrow"):
                    try:
                        total += e.stat().st_size
                    except FileNotFoundError:
                        pass
        return total

    # -- pins (called by the loader's planner, before any thread touches the shard) -------
    def pin(self, shards: list[Shard]) -> list[bool]:
        """Count one more user of each shard; True where it is already usable (no ensure needed).

        An unpinned shard keeps its mapping and its shared lock while idle (up to ``max_open``
        of them), so a shard used again soon costs no system call at all.
        """
        ready = []
        with self._lock:
            self._clock += 1
            for shard in shards:
                e = self._entries.get(shard.raw_sha256)
                if e is None:
                    e = self._entries[shard.raw_sha256] = _Entry()
                e.refs += 1
                e.last_use = self._clock
                ready.append(e.pin_fd is not None and e.mapped is not None)
        return ready

    def unpin(self, shards: list[Shard]) -> None:
        with self._lock:
            for shard in shards:
                self._entries[shard.raw_sha256].refs -= 1
            if self._open > self.max_open:
                self._close_surplus_locked()

    def rows(self, shards: list[Shard]) -> list[np.ndarray]:
        """Each shard's ``(rows, seq_len + 1)`` memory-mapped view; the shards must be pinned and ensured."""
        entries = self._entries
        return [entries[s.raw_sha256].mapped.rows for s in shards]

    # -- ensure: the shard is on disk, verified, pinned across processes and mapped -------
    def ensure(self, shard: Shard) -> FetchResult:
        """Make a pinned shard usable; blocking (runs in a fetch thread)."""
        with self._lock:
            e = self._entries[shard.raw_sha256]
            self._clock += 1
            e.last_use = self._clock
            fd_needed = e.pin_fd is None
        if fd_needed:
            fd = _flock(self._lock_path(shard, "pin"), fcntl.LOCK_SH)
            with self._lock:
                if e.pin_fd is None:
                    e.pin_fd = fd
                else:
                    _unlock(fd)
        path = self.path(shard)
        st = _stat(path)
        if st is not None and e.mapped is not None and st.st_ino == e.inode:
            self._touch(path)
            return FetchResult(0)
        downloaded = 0
        if st is None or not self._verify(shard, path, st):
            downloaded = self._download(shard)
            st = os.stat(path)
        mapped = MappedShard(path)  # mapped while pinned: nobody can evict it in between
        with self._lock:
            if e.mapped is not None:
                e.mapped.close()
                self._open -= 1
            e.mapped, e.inode = mapped, st.st_ino
            self._open += 1
        self._touch(path)
        return FetchResult(downloaded)

    def _verify(self, shard: Shard, path: str, st: os.stat_result) -> bool:
        key = (shard.raw_sha256, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._verified:
            return True
        ok = st.st_size == shard.raw_bytes and sha256_file(path)[0] == shard.raw_sha256
        if ok:
            self._verified.add(key)
        else:
            log.warning("cached shard %s (%s) fails its raw_sha256 check; fetching it again", shard.path, path)
        return ok

    def _download(self, shard: Shard) -> int:
        """Fetch, verify and install one shard, once per node (the .dl lock); returns bytes fetched."""
        path, url = self.path(shard), join(self.base_url, shard.path)
        fd = _flock(self._lock_path(shard, "dl"), fcntl.LOCK_EX)
        try:
            st = _stat(path)  # another process may have installed it while we waited
            if st is not None and self._verify(shard, path, st):
                return 0
            if st is not None:
                _unlink(path)
            last = None
            for attempt in range(self.retries):
                try:
                    n = self._fetch_once(shard, url, path)
                    st = _stat(path)
                    self._verified.add((shard.raw_sha256, st.st_ino, st.st_size, st.st_mtime_ns))
                    return n
                except CacheFullError:  # it already waited; not a fetch failure to retry
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
            _unlock(fd)

    def _fetch_once(self, shard: Shard, url: str, path: str) -> int:
        data = self.fs.cat_file(url)
        actual = sha256_bytes(data)
        if actual != shard.sha256:
            raise HashMismatchError(f"shard {shard.path} as downloaded from {url}", shard.sha256, actual)
        rows = rows_from_table(read_table(pa.py_buffer(data)))
        self._make_room(shard.raw_bytes)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        try:
            stats = write_shard(tmp, rows, compressed=False)
            if stats.sha256 != shard.raw_sha256:
                raise HashMismatchError(f"cache form of shard {shard.path}", shard.raw_sha256, stats.sha256)
            os.replace(tmp, path)
        finally:
            _unlink(tmp)
            with self._lock:
                self._reserved -= shard.raw_bytes
        return len(data)

    # -- eviction --------------------------------------------------------------------------
    def _make_room(self, need: int) -> None:
        """Reserve ``need`` bytes, evicting least-recently-used unpinned shards as required."""
        if self.limit_bytes is None:
            with self._lock:
                self._reserved += need
            return
        deadline = time.monotonic() + self.full_timeout_s
        while True:
            fd = _flock(os.path.join(self.dir, ".evict"), fcntl.LOCK_EX)
            try:
                with self._lock:
                    reserved = self._reserved
                used = self.cached_bytes() + reserved
                if used + need <= self.limit_bytes or self._evict(used + need - self.limit_bytes) >= used + need - self.limit_bytes:
                    with self._lock:
                        self._reserved += need
                    return
            finally:
                _unlock(fd)
            if time.monotonic() > deadline:
                raise CacheFullError(
                    f"cache {self.dir}: limit {self.limit_bytes:,} bytes cannot hold {need:,} more bytes: every cached "
                    f"shard is pinned (by this or another process sharing the cache) for {self.full_timeout_s:g}s; "
                    f"raise cache_limit_bytes or lower prefetch")
            time.sleep(0.05)  # another rank will unpin soon

    def _evict(self, to_free: int) -> int:
        """Delete unpinned cache files, least recently used (atime) first, until ``to_free`` bytes are gone."""
        candidates = []
        with os.scandir(self.dir) as it:
            for de in it:
                if de.name.endswith(".arrow"):
                    try:
                        st = de.stat()
                    except FileNotFoundError:
                        continue
                    candidates.append((st.st_atime_ns, de.name[: -len(".arrow")], st.st_size))
        # Files no shard of this process has open go first (oldest atime first), then this
        # process's idle mappings in its own last-use order: an exact LRU for this process.
        with self._lock:
            def rank(c):
                e = self._entries.get(c[1])
                return (1, e.last_use) if e is not None and e.mapped is not None else (0, c[0])
            candidates.sort(key=rank)
        freed = 0
        for _, name, size in candidates:
            if freed >= to_free:
                break
            with self._lock:
                e = self._entries.get(name)
                if e is not None and e.refs > 0:
                    continue
                if e is not None:  # idle here: drop our own mapping and shared lock first
                    self._release_locked(e)
            try:  # another process pinning it holds LOCK_SH: skip it
                fd = _flock(os.path.join(self.dir, f"{name}.pin"), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            try:
                _unlink(os.path.join(self.dir, f"{name}.arrow"))
                freed += size
                log.debug("evicted %s.arrow (%d bytes)", name, size)
            finally:
                _unlock(fd)
        return freed

    def _close_surplus_locked(self) -> None:
        """Close least-recently-used idle mappings until at most ``max_open`` remain (memory stays
        flat as datasets grow)."""
        idle = sorted((e.last_use, k) for k, e in self._entries.items() if e.refs == 0 and e.mapped is not None)
        for _, k in idle[: max(0, self._open - self.max_open)]:
            self._release_locked(self._entries[k])

    def _release_locked(self, e: _Entry) -> None:
        if e.mapped is not None:
            e.mapped.close()
            e.mapped = None
            self._open -= 1
        if e.pin_fd is not None:
            _unlock(e.pin_fd)
            e.pin_fd = None

    def _touch(self, path: str) -> None:
        """atime = last use: the LRU order every process on the node shares (mtime is left alone,
        it is part of the "already verified" key)."""
        try:
            os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            for e in self._entries.values():
                self._release_locked(e)
            self._entries.clear()


def _stat(path: str):
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

