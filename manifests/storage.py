"""Commit primitives on any fsspec filesystem: what gristmill writes, it writes whole or not at all.

Three operations, the same on a local disk and on an object store (which has no rename):

- :func:`put` / :func:`open_put`: an object appears under its name only complete, replacing any
  older one whole (local: a unique temp file, fsync, ``os.replace``; S3/GCS/Azure: one PUT or a
  multipart upload, which the store makes visible only when completed, aborted on error);
- :func:`put_new`: create-if-absent, the one primitive a race between writers needs. Exactly one
  of any number of concurrent callers creates the object; the others get ``False`` and the
  object is never overwritten (local: ``os.link`` of a complete temp file, which fails if the
  name exists; S3: a conditional PUT, ``If-None-Match: *``);
- :func:`get`: the bytes of a committed object in one read (one GET on S3), so a reader sees one
  version of it, never a mix.

Other fsspec filesystems get :func:`put` through a temp name and ``fs.mv``; :func:`put_new` is
refused on them (no atomic create-if-absent is known there) with a :class:`StorageError` naming
the protocol, rather than silently racing.
"""
from __future__ import annotations

import contextlib
import os
import threading
import uuid

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from .errors import ManifestError

# Object stores whose writes become visible whole (a PUT, or a multipart upload on completion).
_WHOLE_OBJECT_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "abfs", "az", "adl", "memory"}
# ...and those whose create-if-absent is atomic on the server (``mode="create"`` of fsspec).
_CONDITIONAL_PROTOCOLS = {"s3", "s3a"}
_memory_lock = threading.Lock()  # the memory filesystem lives in one process: a lock makes it exclusive


class StorageError(ManifestError):
    """A filesystem cannot give a guarantee gristmill's commit protocol needs."""


def protocols(fs) -> set[str]:
    p = fs.protocol
    return {p} if isinstance(p, str) else set(p)


def is_local(fs) -> bool:
    return isinstance(fs, LocalFileSystem)


def whole_object_writes(fs) -> bool:
    """True when a write to the final name is already invisible until complete (no temp name needed)."""
    return bool(protocols(fs) & _WHOLE_OBJECT_PROTOCOLS)


def fs_path(url: str, **storage_options):
    """``(fs, path)`` of a URL or local path."""
    return url_to_fs(url, **storage_options)


def nearest_dir(path: str) -> str:
    """The nearest existing directory on the way to the local ``path`` (itself if it is one), to write
    into before any work; a file in its place or on the way (``out/x`` under a file ``out``) is a
    ``NotADirectoryError`` naming that file."""
    while not os.path.isdir(path):
        if os.path.lexists(path):
            raise NotADirectoryError(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _tmp_name(path: str) -> str:
    return f"{path}.tmp-{uuid.uuid4().hex[:12]}"  # unique per writer: threads, processes and hosts alike


def _local_write(path: str, data, sync: bool = True) -> str:
    """Write ``data`` to a fresh temp file beside ``path``, fsynced unless ``sync`` is False; returns its name."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def put(fs, path: str, data, *, sync: bool = True) -> None:
    """Write ``data`` (bytes-like) at ``path``, replacing any older object whole; atomic for readers.
    ``sync=False`` skips the local fsync, for a file a later fsynced marker commits (a task's output)."""
    if is_local(fs):
        tmp = _local_write(path, data, sync)
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    elif whole_object_writes(fs):
        fs.pipe_file(path, bytes(data))
    else:
        tmp = _tmp_name(path)
        fs.pipe_file(tmp, bytes(data))
        fs.mv(tmp, path)


def put_new(fs, path: str, data) -> bool:
    """Create ``path`` holding ``data`` if nothing is there: ``True`` if this call created it,
    ``False`` if an object already had the name (it is left as it was). Atomic among any number
    of concurrent writers on the same filesystem (threads, processes, hosts)."""
    if is_local(fs):
        tmp = _local_write(path, data)
        try:
            os.link(tmp, path)  # fails if `path` exists, whoever made it and however close the race
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
    kinds = protocols(fs)
    if kinds & _CONDITIONAL_PROTOCOLS:
        try:
            fs.pipe_file(path, bytes(data), mode="create")  # If-None-Match: *
            return True
        except FileExistsError:
            return False
    if "memory" in kinds:
        with _memory_lock:
            if fs.exists(path):
                return False
            fs.pipe_file(path, bytes(data))
            return True
    raise StorageError(f"{sorted(kinds)[0]}:// has no atomic create-if-absent known to gristmill "
                       f"(publishing needs one to keep concurrent publishers apart); use a local path or s3://")


class PendingObject:
    """A binary file streaming into an object that appears at ``path`` only on :meth:`commit`;
    :meth:`abort` (or a failure before the commit) leaves nothing under ``path``: on an object store
    no partial object anywhere, on a local disk at most a ``.tmp-`` file no reader trusts."""

    def __init__(self, fs, path: str):
        self.fs, self.path = fs, path
        if is_local(fs):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.target = _tmp_name(path)
            self.file = open(self.target, "wb")
        else:
            self.target = path if whole_object_writes(fs) else _tmp_name(path)
            self.file = fs.open(self.target, "wb")

    def write(self, data) -> int:
        return self.file.write(data)

    def commit(self) -> None:
        if is_local(self.fs):
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.target, self.path)
            return
        self.file.close()  # completes the upload: the object appears whole
        if self.target != self.path:
            self.fs.mv(self.target, self.path)

    def abort(self) -> None:
        if is_local(self.fs):
            with contextlib.suppress(OSError):  # closing flushes: a full disk refuses that too
                self.file.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.target)
            return
        discard = getattr(self.file, "discard", None)  # an unfinished multipart upload is aborted, never completed
        if discard is not None:
            discard()
            self.file.closed = True  # closing would complete the upload: the object must never appear
        else:
            self.file.close()
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self.target)


@contextlib.contextmanager
def open_put(fs, path: str):
    """A :class:`PendingObject` committed when the block ends without an error, aborted otherwise."""
    pending = PendingObject(fs, path)
    try:
        yield pending
        pending.commit()  # a commit that fails (a full disk refusing the last flush) aborts too
    except BaseException:
        pending.abort()
        raise


def get(fs, path: str) -> bytes:
    """The whole of a committed object, in one read."""
    return fs.cat_file(path)


def refresh(fs, path: str) -> None:
    """Forget what ``fs`` cached about ``path``'s listing: other writers may have changed it (s3fs
    caches listings per instance)."""
    fs.invalidate_cache(path)
