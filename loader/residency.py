"""Page residency: the shard pages mapped into this process, kept under a limit.

A page read through a mapping counts in the process's RSS until it is unmapped, and the kernel
maps whole page-cache folios per fault, so unchecked RSS grows towards the size of every shard
the run has read. ``MADV_DONTNEED`` on a read-only file mapping drops the pages without closing
it; the data stays in the page cache, so the next read is a minor fault, not I/O.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import os

from gristmill.manifests import MappedShard

from .pins import PinTable

log = logging.getLogger(__name__)

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


def file_pages(mapped: MappedShard) -> tuple[int, int] | None:
    """The shard's file mapping as (start address, length), or None when its rows are not in it
    (MADV_DONTNEED on ordinary memory would zero them). The whole file: reading the Arrow
    footer maps pages too."""
    start, end = mapped.rows.ctypes.data, mapped.rows.ctypes.data + mapped.rows.nbytes
    lo, size = mapped.mapping()
    if not (lo <= start and end <= lo + size) or lo % _PAGE:
        return None
    return lo, size


def dontneed(pages: tuple[int, int]) -> None:
    if _libc.madvise(pages[0], pages[1], _MADV_DONTNEED) != 0:
        log.debug("madvise(MADV_DONTNEED) failed: errno %d", ctypes.get_errno())


class PageResidency:
    """Keeps the pages mapped through ``pins``' open mappings under ``limit_bytes`` (None: no limit)."""

    def __init__(self, pins: PinTable, limit_bytes: int | None):
        self.pins, self.limit_bytes = pins, limit_bytes
        self.releases = 0  # times bound() released every mapping's pages
        self._base = file_backed_resident()  # before any shard is mapped

    def release_all(self) -> None:
        """Unmap the resident pages of every open mapping without closing it. Safe while other
        threads read pinned shards: a read-only file mapping refaults the same bytes."""
        with self.pins.lock:  # held throughout: a mapping closed meanwhile could leave its addresses to other memory
            for e in self.pins.by_id:
                if e.mapped is not None and e.pages is not None:
                    dontneed(e.pages)

    def bound(self) -> None:
        """Past the limit, release the pages of every mapping. Reads the growth of file-backed
        resident memory since the last release from /proc/self/statm (about 2 us). What else in
        the process maps files (a library loaded meanwhile) only brings one release forward: the
        baseline is re-read after each."""
        if self.limit_bytes is None:
            return
        now = file_backed_resident()
        if now is None or self._base is None or now - self._base <= self.limit_bytes:
            return
        self.release_all()
        self.releases += 1
        self._base = file_backed_resident()
