"""The storage seam: every byte gristmill keeps goes through a :class:`Store`, whole or not at all.

A store is resolved once from a URL and its storage options (:meth:`Store.from_url`): a local
path (or ``file://``) gives a :class:`LocalStore`, any other URL an :class:`FsspecStore` of the
class registered for its protocol. What a backend can guarantee is said by three flags, read by
the code that needs them instead of guessing from a URL:

- ``is_local``: the store is this machine's disk (folders exist, ``os`` calls work on its paths);
- ``whole_object_writes``: a write to the final name is invisible until complete (an S3/GCS/Azure
  PUT or multipart upload), so no temp name is needed;
- ``conditional_writes``: :meth:`Store.put_new` (create-if-absent) is atomic, the one primitive a
  race between writers needs (local: ``os.link``; S3: ``If-None-Match: *``).

The commit operations, the same on every store:

- :meth:`Store.put` / :meth:`Store.open_put`: an object appears under its name only complete,
  replacing any older one whole (local: a unique temp file, fsync, ``os.replace``; an object store:
  one PUT or a multipart upload, aborted on error; other filesystems: a temp name and ``mv``);
- :meth:`Store.put_new`: exactly one of any number of concurrent callers creates the object, the
  others get ``False``; a store without conditional writes refuses with a :class:`StorageError`
  naming the protocol rather than silently racing;
- :meth:`Store.read`: the bytes of a committed object in one read (one GET), never a mix of versions.

A store's methods take the paths callers hold (a local path, or a URL of the store's filesystem).
A new backend is one subclass of :class:`FsspecStore` naming its ``protocols`` (docs/architecture.md).
Nothing outside this module looks inside a URL: :func:`is_url`, :func:`split_url` and
:func:`local_path` answer the questions callers have about one. Nothing outside it imports fsspec
either (tests/test_layering.py): :func:`sized_readline` is what a line reader needs of a store's file,
and the simulated remote of the tests and the loader bench (``gmsim://``, :class:`SimulatedFileSystem`)
is defined here, registered only on request (:func:`register_simulated_store`).
"""
from __future__ import annotations

import contextlib
import io
import os
import posixpath
import random
import shutil
import threading
import time
import uuid
from typing import ClassVar

from fsspec.core import split_protocol, url_to_fs
from fsspec.registry import register_implementation
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractBufferedFile

from .errors import ManifestError


class StorageError(ManifestError):
    """A store cannot give a guarantee gristmill's commit protocol needs."""


# -- what a URL says (nowhere else reads one) -----------------------------------------------
def is_url(path: str) -> bool:
    """Whether ``path`` is a URL (``s3://bucket/key``, ``file:///x``) rather than a plain local path."""
    return split_protocol(path)[0] is not None


def split_url(url: str) -> tuple[str, str]:
    """``(protocol, path)`` of a URL as fsspec reads it (``("s3", "bucket/key")``); ``("", path)`` for a
    plain path."""
    protocol, path = split_protocol(url)
    return protocol or "", path


def join_url(protocol: str, path: str) -> str:
    """The URL of ``path`` under ``protocol``, :func:`split_url`'s inverse (a plain path for ``""``)."""
    return f"{protocol}://{path}" if protocol else path


def local_path(url: str) -> str | None:
    """The local path a plain path or ``file://`` URL names; None for any other URL."""
    protocol, path = split_url(url)
    return path if protocol in ("", "file") else None


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


def temp_name(path: str) -> str:
    """A temp name beside ``path``, unique per writer (threads, processes and hosts alike); readers
    never trust a ``.tmp-`` name."""
    return f"{path}.tmp-{uuid.uuid4().hex[:12]}"


# -- the stores -----------------------------------------------------------------------------
class Store:
    """Where gristmill reads and writes. Picklable: a task receives it with its work dir."""

    is_local: ClassVar[bool] = False
    whole_object_writes: ClassVar[bool] = False
    conditional_writes: ClassVar[bool] = False
    fs: "fsspec.AbstractFileSystem"  # the filesystem beneath, for what a store does not wrap (a glob, ``info``)

    def __eq__(self, other) -> bool:  # the same filesystem opened with the same options
        return type(self) is type(other) and self.fs == other.fs

    def __hash__(self) -> int:
        return hash((type(self), self.fs))

    @staticmethod
    def from_url(url: str, **storage_options) -> "Store":
        """The store of ``url`` (a local path or any fsspec URL), its filesystem opened with
        ``storage_options`` (credentials, an endpoint); made once by whoever owns the URL."""
        if not is_url(url):
            return LocalStore()  # a plain path resolves no filesystem: a task makes thousands of these
        fs = url_to_fs(url, **storage_options)[0]
        if type(fs) is LocalFileSystem:  # a subclass (the simulated remote, gmsim://) is its own filesystem
            return LocalStore()
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        kind = next((FsspecStore.kinds[p] for p in sorted(protocols) if p in FsspecStore.kinds), FsspecStore)
        return kind(fs)

    def path(self, url: str) -> str:
        """``url`` as a path of this store's filesystem (its protocol stripped)."""
        raise NotImplementedError

    def join(self, base: str, *parts: str) -> str:
        raise NotImplementedError

    def read(self, path: str) -> bytes:
        """The whole of a committed object, in one read (FileNotFoundError if absent)."""
        raise NotImplementedError

    def open(self, path: str, mode: str = "rb"):
        """A file object for reading (``rb``) a committed object; writes go through put/open_put."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def isdir(self, path: str) -> bool:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        """The names in a folder as other writers left it now (FileNotFoundError if there is none)."""
        raise NotImplementedError

    def modified(self, path: str) -> float:
        """When the object was last written (seconds since the epoch)."""
        raise NotImplementedError

    def escapes(self, path: str, root: str) -> str | None:
        """Where ``path`` really is when a symlink on its way takes it outside the folder ``root``
        (``root`` itself resolved: a linked root is the user's own choice); None when it stays inside.
        Asked before a file found in a folder gristmill does not trust is opened (docs/security.md):
        only a store with symlinks can answer anything but None."""
        return None

    def rm(self, path: str) -> None:
        """Remove one object (FileNotFoundError if absent)."""
        raise NotImplementedError

    def put(self, path: str, data, *, sync: bool = True) -> None:
        """Write ``data`` (bytes-like) at ``path``, replacing any older object whole; atomic for readers.
        ``sync=False`` skips the local fsync, for a file a later fsynced marker commits (a task's output)."""
        raise NotImplementedError

    def put_new(self, path: str, data, *, sync: bool = True) -> bool:
        """Create ``path`` holding ``data`` if nothing is there: ``True`` if this call created it,
        ``False`` if an object already had the name (it is left as it was). Atomic among any number
        of concurrent writers on the same store (threads, processes, hosts). ``sync`` as for :meth:`put`."""
        raise NotImplementedError

    def pending(self, path: str) -> "Pending":
        """A binary file streaming into an object that appears at ``path`` only on ``commit()``."""
        raise NotImplementedError

    def put_file(self, src: str, path: str) -> None:
        """Copy the local file ``src`` to ``path`` whole or not at all, streamed (no copy of it in memory)."""
        with open(src, "rb") as f, self.open_put(path) as out:
            shutil.copyfileobj(f, out.file, 8 << 20)

    @contextlib.contextmanager
    def open_put(self, path: str):
        """A :class:`Pending` object committed when the block ends without an error, aborted otherwise."""
        pending = self.pending(path)
        try:
            yield pending
            pending.commit()  # a commit that fails (a full disk refusing the last flush) aborts too
        except BaseException:
            pending.abort()
            raise


def sized_readline(f, buffer_size: int = 1 << 20):
    """``f`` (a file a store opened for reading) with a ``readline(size)`` that stops at ``size``: an fsspec
    buffered file (an object store's) takes no size and would read a 4 GiB line whole, so it comes wrapped
    in an ``io.BufferedReader``; any other file (a local one's readline takes a size) comes as it is."""
    return io.BufferedReader(f, buffer_size=buffer_size) if isinstance(f, AbstractBufferedFile) else f


class Pending:
    """An object being written: ``write`` into ``file``, then ``commit()`` (it appears whole) or
    ``abort()`` (nothing appears: on an object store no partial object anywhere, on a local disk at
    most a ``.tmp-`` file no reader trusts)."""

    file = None

    def write(self, data) -> int:
        return self.file.write(data)

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


class LocalStore(Store):
    """This machine's disk, through ``os`` calls (no fsspec on the hot path: a step touches thousands
    of small files). ``put_new`` is ``os.link`` of a complete temp file, which fails if the name exists."""

    is_local = True
    conditional_writes = True

    @property
    def fs(self):
        return LocalFileSystem()  # fsspec caches it: one instance per process

    def __repr__(self) -> str:
        return "LocalStore()"

    def path(self, url: str) -> str:
        return split_url(url)[1]

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def read(self, path: str) -> bytes:
        with open(self.path(path), "rb") as f:
            return f.read()

    def open(self, path: str, mode: str = "rb"):
        return open(self.path(path), mode)

    def exists(self, path: str) -> bool:
        return os.path.exists(self.path(path))

    def isdir(self, path: str) -> bool:
        return os.path.isdir(self.path(path))

    def listdir(self, path: str) -> list[str]:
        return os.listdir(self.path(path))

    def modified(self, path: str) -> float:
        return os.path.getmtime(self.path(path))

    def rm(self, path: str) -> None:
        os.unlink(self.path(path))

    def escapes(self, path: str, root: str) -> str | None:
        real, base = os.path.realpath(self.path(path)), os.path.realpath(self.path(root))
        return None if os.path.commonpath([real, base]) == base else real

    def makedirs(self, path: str) -> None:
        """Make the folder ``path`` and those on the way (only a local disk has folders to make)."""
        os.makedirs(self.path(path), exist_ok=True)

    def write_temp(self, path: str, data, sync: bool = True) -> str:
        """Write ``data`` to a fresh temp file beside ``path``, fsynced unless ``sync`` is False; returns its name."""
        path = self.path(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = temp_name(path)
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

    def put(self, path: str, data, *, sync: bool = True) -> None:
        tmp = self.write_temp(path, data, sync)
        try:
            os.replace(tmp, self.path(path))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def put_new(self, path: str, data, *, sync: bool = True) -> bool:
        tmp = self.write_temp(path, data, sync)
        try:
            os.link(tmp, self.path(path))  # fails if `path` exists, whoever made it and however close the race
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def pending(self, path: str) -> "Pending":
        return _LocalPending(self.path(path))

    def put_file(self, src: str, path: str) -> None:
        """Copy the local file ``src`` to ``path`` whole or not at all, in the kernel (``shutil.copyfile``
        uses ``sendfile``): no buffer in this process, whatever the file's size or how many copy at once."""
        path = self.path(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = temp_name(path)
        try:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


class _LocalPending(Pending):
    """A temp file beside the path: fsynced and renamed into place on commit, unlinked on abort."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path, self.target = path, temp_name(path)
        self.file = open(self.target, "wb")

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.target, self.path)

    def abort(self) -> None:
        with contextlib.suppress(OSError):  # closing flushes: a full disk refuses that too
            self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.target)


class FsspecStore(Store):
    """Any other fsspec filesystem. This class itself serves the protocols no subclass names,
    with the guarantees every filesystem gives: a write under a temp name then ``mv`` (which is
    only as atomic as the filesystem's move), and no ``put_new``. A subclass naming ``protocols``
    is what :meth:`Store.from_url` gives for them: a new backend is one such class."""

    protocols: ClassVar[tuple[str, ...]] = ()
    kinds: ClassVar[dict[str, type["FsspecStore"]]] = {}  # protocol -> the subclass that serves it
    write_options: ClassVar[dict] = {}  # what a streaming write is opened with (``fs.open(path, "wb", **...)``)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        FsspecStore.kinds.update(dict.fromkeys(cls.protocols, cls))

    def __init__(self, fs):
        self.fs = fs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fs.protocol!r})"

    @property
    def protocol(self) -> str:
        """The filesystem's protocol, to name in messages."""
        return self.fs.protocol if isinstance(self.fs.protocol, str) else sorted(self.fs.protocol)[0]

    def path(self, url: str) -> str:
        return self.fs._strip_protocol(url)

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts)

    def read(self, path: str) -> bytes:
        return self.fs.cat_file(self.path(path))

    def open(self, path: str, mode: str = "rb"):
        return self.fs.open(self.path(path), mode)

    def exists(self, path: str) -> bool:
        path = self.path(path)
        self.fs.invalidate_cache(path)  # as listdir: another writer (or process) may have removed or made it since
        return self.fs.exists(path)

    def isdir(self, path: str) -> bool:
        return self.fs.isdir(self.path(path))

    def listdir(self, path: str) -> list[str]:
        path = self.path(path)
        self.fs.invalidate_cache(path)  # other writers may have changed it (s3fs caches listings per instance)
        return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False)]

    def modified(self, path: str) -> float:
        return self.fs.modified(self.path(path)).timestamp()

    def rm(self, path: str) -> None:
        self.fs.rm_file(self.path(path))

    def put(self, path: str, data, *, sync: bool = True) -> None:
        path = self.path(path)
        if self.whole_object_writes:
            self.fs.pipe_file(path, bytes(data))
        else:
            tmp = temp_name(path)
            self.fs.pipe_file(tmp, bytes(data))
            self.fs.mv(tmp, path)

    def put_new(self, path: str, data, *, sync: bool = True) -> bool:
        raise StorageError(f"{self.protocol}:// has no atomic create-if-absent known to gristmill "
                           f"(publishing needs one to keep concurrent publishers apart); use a local path or s3://")

    def pending(self, path: str) -> "Pending":
        return _ObjectPending(self, self.path(path))


class _ObjectPending(Pending):
    """An upload that becomes the object only when completed (under a temp name first where the
    store's writes are not whole-object); an abort discards it unfinished."""

    def __init__(self, store: FsspecStore, path: str):
        self.fs, self.path = store.fs, path
        self.target = path if store.whole_object_writes else temp_name(path)
        self.file = self.fs.open(self.target, "wb", **store.write_options)

    def commit(self) -> None:
        self.file.close()  # completes the upload: the object appears whole
        if self.target != self.path:
            self.fs.mv(self.target, self.path)

    def abort(self) -> None:
        discard = getattr(self.file, "discard", None)  # an unfinished multipart upload is aborted, never completed
        if discard is not None:
            discard()
            self.file.closed = True  # closing would complete the upload: the object must never appear
        else:
            self.file.close()
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self.target)


class ObjectStore(FsspecStore):
    """An object store whose writes become visible whole (a PUT, or a multipart upload on completion)."""

    protocols = ("gs", "gcs", "abfs", "az", "adl")
    whole_object_writes = True


class S3Store(ObjectStore):
    """S3 (s3fs), whose conditional PUT (``If-None-Match: *``, fsspec's ``mode="create"``) is
    decided atomically by the server."""

    protocols = ("s3", "s3a")
    conditional_writes = True
    # s3fs buffers a whole part (50 MiB by default) in each open upload: a publish's 16 parallel
    # copies held 800 MiB of the driver. 8 MiB parts: 128 MiB, and objects up to 80 GB (10,000 parts).
    write_options = {"block_size": 8 << 20}

    def put_new(self, path: str, data, *, sync: bool = True) -> bool:
        try:
            self.fs.pipe_file(self.path(path), bytes(data), mode="create")
            return True
        except FileExistsError:
            return False


class MemoryStore(FsspecStore):
    """fsspec's memory filesystem (tests): it lives in one process, so a lock makes create-if-absent exclusive."""

    protocols = ("memory",)
    whole_object_writes = True
    conditional_writes = True
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def put_new(self, path: str, data, *, sync: bool = True) -> bool:
        path = self.path(path)
        with self._lock:
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, bytes(data))
            return True


# -- a simulated remote (tests and ``gristmill loader bench``) ------------------------------------
# It lives here, not beside its users, because it is an fsspec filesystem: nothing but this module
# reaches fsspec (tests/test_layering.py), and a store opened on ``gmsim://`` is an FsspecStore like s3's.
SIMULATED_PROTOCOL = "gmsim"


class SimulatedFileSystem(LocalFileSystem):
    """``gmsim:///abs/path`` serves the local file ``/abs/path`` as a remote store would: every read
    request waits ``latency_s`` plus ``size / bandwidth_bps``, and a fraction ``fail_rate`` of read
    requests fail with an OSError (``corrupt_rate``: return the bytes with one byte flipped). A real
    fsspec filesystem, so the loader reads it through the same code path as ``s3://`` or ``https://``;
    options travel as ``storage_options``. Registered only by :func:`register_simulated_store`, so a
    production process never has a fault-injecting filesystem behind one of its URL schemes."""

    protocol = (SIMULATED_PROTOCOL,)

    def __init__(self, latency_s: float = 0.0, bandwidth_bps: float | None = None, fail_rate: float = 0.0,
                 corrupt_rate: float = 0.0, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if not (0 <= fail_rate < 1 and 0 <= corrupt_rate < 1):
            raise ValueError(f"fail_rate and corrupt_rate must be in [0, 1), got {fail_rate}, {corrupt_rate}")
        self.latency_s, self.bandwidth_bps = float(latency_s), bandwidth_bps
        self.fail_rate, self.corrupt_rate = float(fail_rate), float(corrupt_rate)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        # fsspec caches one instance per option set, so these count every loader using those options.
        self.requests = self.failures = self.corruptions = 0

    def _roll(self) -> float:
        with self._lock:
            return self._rng.random()

    def info(self, path, **kwargs):
        time.sleep(self.latency_s)  # a metadata request (HEAD) costs a round trip too
        return super().info(path, **kwargs)

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        if "r" not in mode:
            return super()._open(path, mode=mode, block_size=block_size, **kwargs)
        with self._lock:
            self.requests += 1
        time.sleep(self.latency_s)
        if self._roll() < self.fail_rate:
            with self._lock:
                self.failures += 1
            raise OSError(f"{SIMULATED_PROTOCOL}: simulated failure reading {path}")
        with super()._open(path, mode="rb") as f:
            data = f.read()
        if self.bandwidth_bps:
            time.sleep(len(data) / self.bandwidth_bps)
        if data and self._roll() < self.corrupt_rate:
            with self._lock:
                self.corruptions += 1
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
            data = bytes(data)
        return io.BytesIO(data)


def register_simulated_store() -> None:
    """Make ``gmsim://`` URLs resolve to :class:`SimulatedFileSystem` in this process (idempotent)."""
    register_implementation(SIMULATED_PROTOCOL, SimulatedFileSystem, clobber=True)


def simulated_url(local: str) -> str:
    """The gmsim:// URL serving a local path."""
    return join_url(SIMULATED_PROTOCOL, local)


def atomic_write(path: str, data, store: Store | None = None) -> None:
    """``store.put(path, data)``: ``data`` at ``path``, whole or not at all. ``store`` is the one its
    owner resolved with its storage options; None resolves ``path`` with none."""
    (store or Store.from_url(path)).put(path, data)
