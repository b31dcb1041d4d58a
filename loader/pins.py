"""The pin table: which shards this process uses, and where their rows are mapped.

Each shard (by cache form, ``raw_sha256``) has an entry id; the pin count, last use, readiness
and row address of every entry live in numpy arrays at that id, so a whole step's shards are
pinned and located with a few numpy calls. A pinned entry is never evicted or unmapped. An
unpinned one keeps its mapping and its shared ``.pin`` lock while idle (up to ``max_open`` of
them), so a shard used again soon costs no system call at all.
"""
from __future__ import annotations

import threading

import numpy as np

from gristmill.manifests import Shard

from .cache_files import unlock


class Entry:
    """One shard as this process sees it: its pin lock and mapping (the rest is in the table's arrays)."""

    __slots__ = ("id", "pin_fd", "mapped", "inode", "pages")

    def __init__(self, id: int):
        self.id, self.pin_fd, self.mapped, self.inode, self.pages = id, None, None, None, None


class PinTable:
    def __init__(self, max_open: int):
        self.max_open = max_open
        self.lock = threading.Lock()  # guards the entries and their arrays, the clock and the cache's reservations
        self.entries: dict[str, Entry] = {}  # raw_sha256 -> entry; ids never change while the table lives
        self.by_id: list[Entry] = []
        self.refs = np.zeros(0, np.int64)  # pins held in this process
        self.last_use = np.zeros(0, np.int64)  # clock at the last pin or use
        self.ready = np.zeros(0, bool)  # mapped (and so pinned across processes): no ensure needed
        self.address = np.zeros(0, np.int64)  # the first row's address while mapped (0: not mapped)
        self.end = np.zeros(0, np.int64)  # the address just past the last row while mapped
        self.clock = 0
        self.open = 0  # entries with a mapping (pinned or idle)

    # -- called by the loader's planner, before any thread touches the shard ------------------
    def ids(self, shards: list[Shard]) -> np.ndarray:
        """The entry id of each shard (shards with the same cache form share one)."""
        with self.lock:
            for shard in shards:
                if shard.raw_sha256 not in self.entries:
                    e = self.entries[shard.raw_sha256] = Entry(len(self.by_id))
                    self.by_id.append(e)
            if len(self.by_id) > self.refs.size:
                grow = 2 * len(self.by_id) - self.refs.size
                self.refs, self.last_use, self.ready, self.address, self.end = (
                    np.concatenate([a, np.zeros(grow, a.dtype)])
                    for a in (self.refs, self.last_use, self.ready, self.address, self.end))
            return np.array([self.entries[s.raw_sha256].id for s in shards], dtype=np.int64)

    def pin_ids(self, ids: np.ndarray) -> np.ndarray:
        """Count one more user of each entry (``ids`` distinct); returns the ids not usable yet."""
        with self.lock:
            self.clock += 1
            self.refs[ids] += 1
            self.last_use[ids] = self.clock
            return ids[~self.ready[ids]]

    def unpin_ids(self, ids: np.ndarray) -> None:
        with self.lock:
            self.refs[ids] -= 1
            if self.open > self.max_open:
                self._close_surplus_locked()

    def bounds(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each entry's rows as addresses ``[start, end)`` (0, 0 when not mapped); valid while pinned."""
        return self.address[ids], self.end[ids]

    def rows(self, shards: list[Shard]) -> list[np.ndarray]:
        """Each shard's ``(rows, seq_len + 1)`` memory-mapped view; the shards must be pinned and mapped."""
        return [self.entries[s.raw_sha256].mapped.rows for s in shards]

    # -- the cache's side ---------------------------------------------------------------------
    def use(self, raw_sha256: str) -> Entry:
        """The entry, marked as used now."""
        with self.lock:
            e = self.entries[raw_sha256]
            self.clock += 1
            self.last_use[e.id] = self.clock
            return e

    def install_locked(self, e: Entry, mapped, inode: int, pages) -> None:
        """``e`` is now served by ``mapped`` (replacing an older mapping of it)."""
        if e.mapped is not None:
            e.mapped.close()
            self.open -= 1
        e.mapped, e.inode, e.pages = mapped, inode, pages
        self.address[e.id], self.ready[e.id] = mapped.rows.ctypes.data, True
        self.end[e.id] = mapped.rows.ctypes.data + mapped.rows.nbytes
        self.open += 1

    def eviction_rank_locked(self, name: str, atime_ns: int) -> tuple:
        """Files no entry of this process has open go first (oldest atime first), then this
        process's idle mappings in its own last-use order: an exact LRU for this process."""
        e = self.entries.get(name)
        return (1, int(self.last_use[e.id])) if e is not None and e.mapped is not None else (0, atime_ns)

    def pinned_locked(self, name: str) -> bool:
        e = self.entries.get(name)
        return e is not None and self.refs[e.id] > 0

    def release_locked(self, name_or_entry) -> None:
        """Close the entry's mapping and give up its shared lock (an idle entry, before eviction)."""
        e = self.entries.get(name_or_entry) if isinstance(name_or_entry, str) else name_or_entry
        if e is None:
            return
        if e.mapped is not None:
            e.mapped.close()
            e.mapped = None
            self.address[e.id], self.end[e.id], self.ready[e.id] = 0, 0, False
            self.open -= 1
        if e.pin_fd is not None:
            unlock(e.pin_fd)
            e.pin_fd = None

    def _close_surplus_locked(self) -> None:
        """Close least-recently-used idle mappings until at most ``max_open`` remain (memory stays
        flat as datasets grow)."""
        idle = np.flatnonzero(self.ready & (self.refs == 0))
        oldest = idle[np.argsort(self.last_use[idle], kind="stable")[: max(0, self.open - self.max_open)]]
        for i in oldest.tolist():
            self.release_locked(self.by_id[i])

    def close(self) -> None:
        with self.lock:
            for e in self.by_id:
                self.release_locked(e)
            self.refs[:] = 0
