"""The cache directory's files and the few system calls on them (locks, stat, unlink, atime).

    <raw_sha256>.arrow          the uncompressed, memory-mappable cache form of a shard
    <raw_sha256>.dl             download lock: one process per node downloads a shard
    <raw_sha256>.pin            pin lock: every process using a shard holds it shared
    <raw_sha256>.src-<sha256>   empty: a verified download proved that published file <sha256> has this cache form
    .evict                      eviction lock: one process at a time frees space
"""
from __future__ import annotations

import fcntl
import os
import time

from gristmill.manifests import Shard

EVICT_LOCK = ".evict"
SUFFIX = ".arrow"
TMP = ".arrow.tmp-"


def shard_path(cache_dir: str, shard: Shard) -> str:
    return os.path.join(cache_dir, f"{shard.raw_sha256}{SUFFIX}")


def lock_path(cache_dir: str, shard: Shard, kind: str) -> str:
    return os.path.join(cache_dir, f"{shard.raw_sha256}.{kind}")


def cached_bytes(cache_dir: str) -> int:
    """Bytes of complete cache files in the directory (what the limit bounds)."""
    total = 0
    with os.scandir(cache_dir) as it:
        for e in it:
            if e.name.endswith(SUFFIX):
                try:
                    total += e.stat().st_size
                except FileNotFoundError:
                    pass
    return total


def remove_orphans(cache_dir: str) -> None:
    """Delete temporary files left by dead processes (a crash mid-download), so they never fill the disk."""
    with os.scandir(cache_dir) as it:
        for de in it:
            if TMP not in de.name:
                continue
            pid = de.name.split(TMP, 1)[1].split("-", 1)[0]
            if pid.isdigit() and not alive(int(pid)):
                unlink(de.path)


def touch(path: str) -> None:
    """atime = last use: the LRU order every process on the node shares (mtime is left alone,
    it is part of the "already verified" key)."""
    try:
        os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))
    except FileNotFoundError:
        pass


def flock(path: str, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def stat(path: str):
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
