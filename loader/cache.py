"""The local shard cache: verified downloads, shared by the ranks of a node, LRU under a limit.

Layout of ``cache_dir`` (meant for local NVMe)::

    <raw_sha256>.arrow   the uncompressed, memory-mappable cache form of a shard
    <raw_sha256>.dl      download lock: one process per node downloads a shard
    <raw_sha256>.pin     pin lock: every process using a shard holds it shared
    <raw_sha256>.src-<sha256>  empty: a verified download proved that published file <sha256> has this cache form
    .evict               eviction lock: one process at a time frees space

Files are named by the content hash of the cache form, so two datasets that share a shard
share its cache entry and nothing is ever confused with a stale copy. A cached file serves a shard
only where a verified download linked that shard's published ``sha256`` to it (the ``.src-`` marker):
a manifest stating another shard's cache facts gets its own file fetched and refused, never the other
shard's rows; and the shards listed to one cache that state the same cache form must state the same
published file (else a ``ManifestError`` at construction). A shard is downloaded
whole into memory, checked against the manifest's ``sha256`` and ``bytes`` and against what
the manifest states about its contents (schema, token dtype, seq_len + 1 tokens per row, row
count), decompressed, written under a temporary name, checked against ``raw_sha256`` and
``raw_bytes`` and only then renamed into place. A cached file found on disk is re-hashed once
per process before first use: a flipped byte on the NVMe is caught, the file deleted and the
shard fetched again. Every mapping is checked against the manifest's facts before a row is
read through it, and its token ids are scanned once per process against ``vocab_size``: a
manifest with a valid hash but wrong facts is refused (``FactMismatchError``, never retried).

Pins are ``flock`` shared locks, so they hold across processes: eviction takes a non-blocking
exclusive lock and skips any shard some process has pinned (an in-flight or prefetched batch
needs it). Deleting a file another process has memory-mapped is safe on POSIX: its mapping
stays valid until it is closed.
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass
from typing import Sequence

import fsspec
import numpy as np
import pyarrow as pa

from gristmill.manifests import (FactMismatchError, HashMismatchError, ManifestError, MappedShard, Published, Shard,
                                 check_vocab, checked_rows, join, sha256_bytes, sha256_file)
from gristmill.manifests.shards import read_table, write_shard
from gristmill.errors import GristmillError, UsageError

log = logging.getLogger(__name__)


class CacheError(GristmillError):
    """The local shard cache cannot serve a shard: a fetch that kept failing, or no room."""


class ShardFetchError(CacheError):
    """A shard could not be fetched and verified after every retry."""


class CacheFullError(CacheError):
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
    """One shard as this process sees it: its pin lock and mapping. Its pin count, last use,
    readiness and row address live in the cache's arrays at ``id``, so a whole step's shards
    are pinned and located with a few numpy calls."""

    __slots__ = ("id", "pin_fd", "mapped", "inode", "pages")

    def __init__(self, id: int):
        self.id, self.pin_fd, self.mapped, self.inode, self.pages = id, None, None, None, None


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
        # Cached shards are named by content, so two sources may list the same one; it is fetched
        # from one of them with THAT source's facts (path, sha256, bytes), never a mix of two.
        self._source = {s.raw_sha256: (p, s) for p in reversed(sources) for s in p.manifest.shards}
        _check_one_file_per_cache_form(sources)
        self.fs = fsspec.core.url_to_fs(self.base_url, **(storage_options or {}))[0]
        self._fs = {p.url: self.fs if _protocol(p.url) == _protocol(self.base_url) else fsspec.core.url_to_fs(p.url)[0]
                    for p in sources}
        self.limit_bytes, self.retries, self.backoff_s = limit_bytes, retries, backoff_s
        self.max_open, self.full_timeout_s, self.mapped_limit_bytes = max_open, full_timeout_s, mapped_limit_bytes
        self.page_releases = 0  # times bound_mapped_pages released every mapping's pages
        self._mapped_base = file_backed_resident()  # before any shard is mapped
        self._lock = threading.Lock()  # guards the entries and their arrays, _reserved, _clock
        self._entries: dict[str, _Entry] = {}  # raw_sha256 -> entry; ids never change while the cache lives
        self._by_id: list[_Entry] = []
        self._refs = np.zeros(0, np.int64)  # pins held in this process
        self._last_use = np.zeros(0, np.int64)  # _clock at the last pin or ensure
        self._ready = np.zeros(0, bool)  # mapped (and so pinned across processes): no ensure needed
        self._address = np.zeros(0, np.int64)  # the first row's address while mapped (0: not mapped)
        self._end = np.zeros(0, np.int64)  # the address just past the last row while mapped
        self._reserved = 0  # bytes of downloads in progress in this process, not yet on disk
        self._clock = 0
        self._open = 0  # entries with a mapping (pinned or idle)
        self._verified: set[tuple] = set()  # (name, inode, size, mtime_ns) hashed by this process
        self._in_vocab: set[str] = set()  # raw_sha256 of the shards whose token ids were scanned (same content)
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
    def ids(self, shards: list[Shard]) -> np.ndarray:
        """The entry id of each shard (shards with the same cache form share one), for the ``*_ids`` methods."""
        with self._lock:
            for shard in shards:
                if shard.raw_sha256 not in self._entries:
                    e = self._entries[shard.raw_sha256] = _Entry(len(self._by_id))
                    self._by_id.append(e)
            if len(self._by_id) > self._refs.size:
                grow = 2 * len(self._by_id) - self._refs.size
                self._refs, self._last_use, self._ready, self._address, self._end = (
                    np.concatenate([a, np.zeros(grow, a.dtype)])
                    for a in (self._refs, self._last_use, self._ready, self._address, self._end))
            return np.array([self._entries[s.raw_sha256].id for s in shards], dtype=np.int64)

    def pin_ids(self, ids: np.ndarray) -> np.ndarray:
        """Count one more user of each entry (``ids`` distinct); returns the ids not usable yet (each needs ``ensure``).

        An unpinned shard keeps its mapping and its shared lock while idle (up to ``max_open``
        of them), so a shard used again soon costs no system call at all.
        """
        with self._lock:
            self._clock += 1
            self._refs[ids] += 1
            self._last_use[ids] = self._clock
            return ids[~self._ready[ids]]

    def unpin_ids(self, ids: np.ndarray) -> None:
        with self._lock:
            self._refs[ids] -= 1
            if self._open > self.max_open:
                self._close_surplus_locked()

    def bounds(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each entry's rows as addresses ``[start, end)`` (C-contiguous rows; 0, 0 when not mapped);
        valid while it stays pinned."""
        return self._address[ids], self._end[ids]

    def rows(self, shards: list[Shard]) -> list[np.ndarray]:
        """Each shard's ``(rows, seq_len + 1)`` memory-mapped view; the shards must be pinned and ensured."""
        entries = self._entries
        return [entries[s.raw_sha256].mapped.rows for s in shards]

    def release_pages(self) -> None:
        """Unmap the resident pages of every open mapping (``MADV_DONTNEED``) without closing it.

        The pages a process has read through a mapping count in its RSS until unmapped; on a
        large dataset they grow with the shards a run reads. The data stays in the page cache,
        so the next read of a released page is a minor fault, not I/O. Safe while other threads
        read pinned shards: a read-only file mapping refaults the same bytes.
        """
        with self._lock:  # held throughout: a mapping closed meanwhile could leave its addresses to other memory
            for e in self._by_id:
                if e.mapped is not None and e.pages is not None:
                    _dontneed(e.pages)

    def bound_mapped_pages(self) -> None:
        """Keep the shard pages mapped into this process under ``mapped_limit_bytes``.

        A page read through a mapping counts in the process's RSS until it is unmapped, and the
        kernel maps whole page-cache folios per fault, so unchecked RSS grows towards the size of
        every shard the run has read. This reads the growth of file-backed resident memory since
        the last release from /proc/self/statm (about 2 us) and, past the limit, releases the
        pages of every mapping. What else in the process maps files (a library loaded meanwhile)
        only brings one release forward: the baseline is re-read after each.
        """
        if self.mapped_limit_bytes is None:
            return
        now = file_backed_resident()
        if now is None or self._mapped_base is None or now - self._mapped_base <= self.mapped_limit_bytes:
            return
        self.release_pages()
        self.page_releases += 1
        self._mapped_base = file_backed_resident()

    # -- ensure: the shard is on disk, verified, pinned across processes and mapped -------
    def ensure(self, shard: Shard) -> FetchResult:
        """Make a pinned shard usable; blocking (runs in a fetch thread)."""
        with self._lock:
            e = self._entries[shard.raw_sha256]
            self._clock += 1
            self._last_use[e.id] = self._clock
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
        pub, shard = self._source[shard.raw_sha256]
        manifest = pub.manifest
        mapped = MappedShard(path, manifest, shard)  # mapped while pinned: nobody can evict it in between
        if shard.raw_sha256 not in self._in_vocab:  # a full read, once per shard per process (memory speed)
            try:
                check_vocab(mapped.rows, manifest, shard)
            except BaseException:
                mapped.close()
                raise
            self._in_vocab.add(shard.raw_sha256)
        with self._lock:
            if e.mapped is not None:
                e.mapped.close()
                self._open -= 1
            e.mapped, e.inode, e.pages = mapped, st.st_ino, _file_pages(mapped)
            if self.mapped_limit_bytes is not None and e.pages is not None:  # what reading the Arrow footer mapped
                _dontneed(e.pages)
            self._address[e.id], self._ready[e.id] = mapped.rows.ctypes.data, True
            self._end[e.id] = mapped.rows.ctypes.data + mapped.rows.nbytes
            self._open += 1
        self._touch(path)
        return FetchResult(downloaded)

    def _linked(self, shard: Shard) -> bool:
        return os.path.exists(self._lock_path(shard, f"src-{shard.sha256}"))

    def _verify(self, shard: Shard, path: str, st: os.stat_result) -> bool:
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

    def _download(self, shard: Shard) -> int:
        """Fetch, verify and install one shard, once per node (the .dl lock); returns bytes fetched."""
        pub, shard = self._source[shard.raw_sha256]
        path, url = self.path(shard), join(pub.url, shard.path)
        fd = _flock(self._lock_path(shard, "dl"), fcntl.LOCK_EX)
        try:
            st = _stat(path)  # another process may have installed it while we waited
            if st is not None and self._verify(shard, path, st):
                return 0
            if st is not None and not (st.st_size == shard.raw_bytes and sha256_file(path)[0] == shard.raw_sha256):
                _unlink(path)  # damaged; a sound file (another shard's, or unlinked) is replaced by the fetch
            last = None
            for attempt in range(self.retries):
                try:
                    n = self._fetch_once(shard, url, path)
                    st = _stat(path)
                    with open(self._lock_path(shard, f"src-{shard.sha256}"), "wb"):
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
            _unlock(fd)

    def _fetch_once(self, shard: Shard, url: str, path: str) -> int:
        pub, _ = self._source[shard.raw_sha256]
        data = self._fs[pub.url].cat_file(url)
        actual = sha256_bytes(data)
        if actual != shard.sha256:
            raise HashMismatchError(f"shard {shard.path} as downloaded from {url}", shard.sha256, actual)
        # The bytes are the pinned ones from here on: a mismatch below is the manifest's, not the network's.
        if len(data) != shard.bytes:
            raise FactMismatchError(shard.path, "bytes", shard.bytes, len(data))
        rows = checked_rows(read_table(pa.py_buffer(data)), pub.manifest, shard)
        self._make_room(shard.raw_bytes)
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
                return (1, int(self._last_use[e.id])) if e is not None and e.mapped is not None else (0, c[0])
            candidates.sort(key=rank)
        freed = 0
        for _, name, size in candidates:
            if freed >= to_free:
                break
            with self._lock:
                e = self._entries.get(name)
                if e is not None and self._refs[e.id] > 0:
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
        idle = np.flatnonzero(self._ready & (self._refs == 0))
        oldest = idle[np.argsort(self._last_use[idle], kind="stable")[: max(0, self._open - self.max_open)]]
        for i in oldest.tolist():
            self._release_locked(self._by_id[i])

    def _release_locked(self, e: _Entry) -> None:
        if e.mapped is not None:
            e.mapped.close()
            e.mapped = None
            self._address[e.id], self._end[e.id], self._ready[e.id] = 0, 0, False
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
            for e in self._by_id:
                self._release_locked(e)
            self._refs[:] = 0


_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_DONTNEED = 4  # Linux
_PAGE = mmap.PAGESIZE


class _FileBackedResident:
    """Bytes of file-backed (and shared) memory resident in this process, from /proc/self/statm;
    None where there is no /proc. About 2 us a call: the file stays open (and is reopened after
    a fork, since /proc/self is resolved when it is opened)."""

    def __init__(self):
        self.fd, self.pid = None, None

    def __call__(self) -> int | None:
        if self.pid != os.getpid():
            try:
                self.fd, self.pid = os.open("/proc/self/statm", os.O_RDONLY), os.getpid()
            except OSError:
                return None
        return int(os.pread(self.fd, 256, 0).split()[2]) * _PAGE


file_backed_resident = _FileBackedResident()


def _file_pages(mapped: MappedShard) -> tuple[int, int] | None:
    """The shard's file mapping as (start address, length), or None when its rows are not in it
    (MADV_DONTNEED on ordinary memory would zero them). The whole file: reading the Arrow
    footer maps pages too."""
    start, end = mapped.rows.ctypes.data, mapped.rows.ctypes.data + mapped.rows.nbytes
    lo, size = mapped.mapping()
    if not (lo <= start and end <= lo + size) or lo % _PAGE:
        return None
    return lo, size


def _dontneed(pages: tuple[int, int]) -> None:
    if _libc.madvise(pages[0], pages[1], _MADV_DONTNEED) != 0:
        log.debug("madvise(MADV_DONTNEED) failed: errno %d", ctypes.get_errno())


def _check_one_file_per_cache_form(sources: Sequence[Published]) -> None:
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
    return url.partition("://")[0] if "://" in url else "file"


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

