"""A manifest store under any fsspec root: ``<root>/<dataset>/v<N>/manifest.json`` + ``latest``.

Publishing claims ``v<N>/`` (a create-if-absent of ``v<N>/.claim``), copies the version's files
into it and writes ``manifest.json`` last; the manifest is the commit. A ``v<N>/`` without a
manifest is an aborted (or running) publish and is never read. A published version is never
overwritten, and concurrent publishers never share a number (manifests/storage.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gristmill.errors import os_error_text

from .errors import LatestPointerError, ManifestError, ManifestNotFoundError, PublishError, VersionExistsError
from .manifest import Manifest
from .storage import Store

_VERSION_DIR = re.compile(r"^v(\d+)$")
# A dataset name is one directory under the store root: no separators, never `.` or `..`.
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MANIFEST_FILE = "manifest.json"
LATEST_FILE = "latest"
CLAIM_FILE = ".claim"  # v<N>/.claim: the create-if-absent that gives one publish the number N
_TWIN_WAIT_S = 600.0  # how long a publish waits for another host's publish of the same content to commit
_CLAIM_GRACE_S = 2.0  # how long a local v<N>/ may stand without its .claim before it counts as abandoned
# A publish copies up to _COPY_THREADS files at once, each through one buffer of _COPY_CHUNK where
# an object store is on either side: 16 MiB of the driver's memory at most (8 MiB chunks made it 128
# MiB and up, and a 2 GB run's driver peak 393 MB against 221 MB at 200 MB: issue 32,
# docs/benchmarks.md); disk to disk, the kernel copies (LocalStore.put_file)
_COPY_THREADS = 16
_COPY_CHUNK = 1 << 20


def join(base: str, *parts: str) -> str:
    """Join URL path parts with '/' whatever the filesystem."""
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


@dataclass(frozen=True)
class Published:
    manifest: Manifest
    url: str  # the version directory: shard paths in the manifest are relative to it
    # the store it was loaded from when that took storage options (verify and the document index
    # read its files through it); None: the URL's, with none
    store: Store | None = field(default=None, compare=False, repr=False)


class ManifestStore:
    def __init__(self, root: str, **storage_options):
        self.root = root.rstrip("/")
        self.storage = Store.from_url(self.root, **storage_options)  # every commit goes through it
        self.fs, self._root_path = self.storage.fs, self.storage.path(self.root)  # its filesystem, for listings
        self.storage_options = storage_options

    # -- reading ----------------------------------------------------------------------------
    def datasets(self) -> list[str]:
        if not self.fs.exists(self._root_path):
            return []
        return sorted(
            posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self._root_path, detail=False) if self.versions(posixpath.basename(p.rstrip("/")))
        )

    def versions(self, dataset: str) -> list[int]:
        base = posixpath.join(self._root_path, dataset)
        self.fs.invalidate_cache(base)  # other writers may have published since this instance listed
        if not self.fs.isdir(base):
            return []
        out = []
        for p in self.fs.ls(base, detail=False):
            m = _VERSION_DIR.match(posixpath.basename(p.rstrip("/")))
            if m and self.fs.exists(posixpath.join(p, MANIFEST_FILE)):
                out.append(int(m.group(1)))
        return sorted(out)

    def latest(self, dataset: str) -> int:
        pointer = posixpath.join(self._root_path, dataset, LATEST_FILE)
        self.fs.invalidate_cache(posixpath.dirname(pointer))
        if self.fs.exists(pointer):
            return read_latest(self.fs, pointer, join(self.root, dataset, LATEST_FILE))
        versions = self.versions(dataset)
        if not versions:
            raise ManifestNotFoundError(f"no published version of dataset {dataset!r} under {self.root}")
        return versions[-1]

    def version_url(self, dataset: str, version: int) -> str:
        return join(self.root, dataset, f"v{version}")

    def load(self, dataset: str, version: int | str = "latest", *, expected_sha256: str | None = None) -> Published:
        if version == "latest":
            version = self.latest(dataset)
        url = self.version_url(dataset, int(version))
        return load_manifest(url, expected_sha256=expected_sha256, **self.storage_options)

    # -- publishing -------------------------------------------------------------------------
    def publish(self, manifest: Manifest, files_dir: str, *, version: int | None = None,
                files_store: Store | None = None) -> Published:
        """Publish ``manifest`` with the files under ``files_dir`` of ``files_store`` (None: the store
        of ``files_dir``) as a new version.

        Idempotent on content: if the latest version already has this manifest hash, it is
        returned unchanged. An explicit ``version`` that already exists is refused.

        Safe under concurrency, on a local disk and on an object store (docs/format.md, "Store"):
        the version number is claimed first by a create-if-absent of ``v<N>/.claim`` (exactly one
        writer wins each number; the others try N+1), only the claimer writes into ``v<N>/``, and its
        ``manifest.json``, written last and create-if-absent too, is the commit.
        """
        if not DATASET_NAME.fullmatch(manifest.dataset):
            raise ManifestError(f"dataset name {manifest.dataset!r} must match {DATASET_NAME.pattern}")
        existing = self.versions(manifest.dataset)
        if version is None and existing:
            # Read back as the same kind of manifest (a dataset's or a mixture's: manifests.mixture).
            latest = _load_as(type(manifest), self.version_url(manifest.dataset, existing[-1]), None, self.storage_options)
            if latest.manifest.sha256 == manifest.sha256:
                return latest
        elif version in existing:
            raise VersionExistsError(f"{manifest.dataset} v{version} is already published; published versions are never overwritten")
        files = _pinned_files(manifest)
        source = files_store or Store.from_url(files_dir)
        src_fs, src_root = source.fs, source.path(files_dir)
        for rel in files:
            if not src_fs.exists(posixpath.join(src_root, rel)):
                raise ManifestError(f"cannot publish: pinned file {rel!r} is missing from {files_dir}")
        explicit = version is not None
        try:
            version = self._claim(manifest.dataset, version, manifest.sha256)
        except OSError as e:
            raise self._failed(join(self.root, manifest.dataset), e, "") from e
        base = posixpath.join(self._root_path, manifest.dataset)
        vdir = posixpath.join(base, f"v{version}")
        same_store = src_fs is self.fs and not self.storage.is_local

        def copy(rel: str) -> None:
            src, dst = posixpath.join(src_root, rel), posixpath.join(vdir, rel)
            if same_store:  # object store to itself: a server-side copy, visible only when complete
                self.fs.copy(src, dst)
                return
            if source.is_local and self.storage.is_local:  # disk to disk: in the kernel, no buffer here
                self.storage.put_file(src, dst)
                return
            with src_fs.open(src, "rb") as fi, self.storage.open_put(dst) as fo:
                while chunk := fi.read(_COPY_CHUNK):
                    fo.write(chunk)

        try:
            if not explicit and (twin := self._twin(manifest, version, existing[-1] if existing else 0)) is not None:
                self._release(vdir)  # a concurrent publish of the same content committed it first
                return twin
            # Parallel copy: publishing is I/O (object stores answer each request slowly, not serially).
            if files:
                with ThreadPoolExecutor(max_workers=min(_COPY_THREADS, len(files))) as pool:
                    list(pool.map(copy, files))
            published = manifest.published(version)  # created_at: now, once the files are in place
            committed = _put_new_or_own(self.storage, posixpath.join(vdir, MANIFEST_FILE), published.to_json().encode())
        except BaseException as e:
            self._release(vdir)  # nothing that looks like a version is left, and the number is free again
            if isinstance(e, OSError):
                raise self._failed(self.version_url(manifest.dataset, version), e, f" (v{version} was removed)") from e
            raise
        if not committed:
            raise VersionExistsError(f"{join(self.version_url(manifest.dataset, version), MANIFEST_FILE)} appeared while "
                                     f"this writer held the claim on v{version}: another writer ignores {CLAIM_FILE}")
        self._point_latest(manifest.dataset)
        return Published(published, self.version_url(manifest.dataset, version), self.storage if self.storage_options else None)

    @staticmethod
    def _failed(where: str, e: OSError, removed: str) -> PublishError:
        return PublishError(f"cannot publish {where}: {os_error_text(e)}; nothing was published{removed}, and the same "
                            "command publishes again")

    def _release(self, vdir: str) -> None:
        """Remove an uncommitted version directory this writer claimed: its files, then the claim
        last (so no other writer takes the number while files of this one are still there). Best
        effort: a store that fails here (the disk or the endpoint that failed the publish) keeps
        a ``v<N>/`` without manifest.json, which no reader trusts and no writer reuses."""
        claim = posixpath.join(vdir, CLAIM_FILE)
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(vdir)
            if rest := [p for p in self.fs.ls(vdir, detail=False) if p != claim]:
                self.fs.rm(rest, recursive=True)  # files and folders alike (on an object store, batched deletes)
            self.fs.rm_file(claim)
            if self.storage.is_local:  # the folder itself (an object store has none)
                os.rmdir(vdir)

    def _twin(self, manifest: Manifest, version: int, seen: int) -> Published | None:
        """The version a concurrent publisher of the same content (same manifest sha256) committed,
        if one claimed a number below ``version`` since this writer looked (``seen``): the lowest
        such claim publishes, the others wait for it and return its version, so N concurrent
        prepares of the same data publish it once. Its claim vanishing (its publish failed and was
        released) or its writer dying (same host) leaves this writer to publish."""
        if version <= seen + 1:  # no number between (one publisher: the usual case): nothing to list
            return None
        base = posixpath.join(self._root_path, manifest.dataset)
        for n in sorted(n for n in self._taken(base) if seen < n < version):
            vdir = posixpath.join(base, f"v{n}")
            start = time.monotonic()
            deadline = start + _TWIN_WAIT_S
            while (committed := self._committed(manifest, n)) is None:
                try:
                    claim = json.loads(self.storage.read(posixpath.join(vdir, CLAIM_FILE)))
                except FileNotFoundError:
                    # A local v<N>/ folder appears before its claim is linked in: give it a moment.
                    if self.fs.isdir(vdir) and time.monotonic() - start < _CLAIM_GRACE_S:
                        time.sleep(0.05)
                        continue
                    break  # released (its publish failed), or never claimed
                except ValueError:
                    break  # not a claim of this protocol
                if (not isinstance(claim, dict) or claim.get("sha256") != manifest.sha256 or not _alive(claim)
                        or time.monotonic() > deadline):
                    # Its writer may have committed and exited between the look for its manifest.json
                    # above and this answer (issue 39: 1 in 6 races on S3 published the content twice):
                    # a gone writer is only believed once its version is seen uncommitted after it.
                    committed = self._committed(manifest, n)
                    break
                time.sleep(0.2)
            if committed:  # False: v<n> committed other content
                return committed
        return None

    def _committed(self, manifest: Manifest, n: int) -> Published | bool | None:
        """v<n> if it is committed with ``manifest``'s content; False if committed with other content;
        None while uncommitted."""
        vdir = posixpath.join(self._root_path, manifest.dataset, f"v{n}")
        self.fs.invalidate_cache(vdir)
        if not self.fs.exists(posixpath.join(vdir, MANIFEST_FILE)):
            return None
        other = _load_as(type(manifest), self.version_url(manifest.dataset, n), None, self.storage_options)
        return other if other.manifest.sha256 == manifest.sha256 else False

    def _claim(self, dataset: str, version: int | None, sha256: str) -> int:
        """Take a version number for one publish: ``version``, or the first after every number in
        use (published, being published, or left by a writer that died: a directory without
        manifest.json is never reused; a publish that fails releases its number). Exactly one of
        any number of concurrent writers gets each number. The claim records the manifest's sha256
        (``_twin``)."""
        base = posixpath.join(self._root_path, dataset)
        claim = json.dumps({"writer": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                            "claimed_at": time.time(), "sha256": sha256}).encode()
        while True:
            n = version if version is not None else max(self._taken(base), default=0) + 1
            try:
                if _put_new_or_own(self.storage, posixpath.join(base, f"v{n}", CLAIM_FILE), claim):
                    return n
            except OSError:
                if self.storage.is_local:  # the folder the claim was to go in, if it is empty
                    with contextlib.suppress(OSError):
                        os.rmdir(posixpath.join(base, f"v{n}"))
                raise
            if version is not None:
                raise VersionExistsError(f"{dataset} v{version} is already claimed by another publish (its "
                                         f"{CLAIM_FILE} exists); published versions are never overwritten")

    def _taken(self, base: str) -> list[int]:
        self.fs.invalidate_cache(base)
        if not self.fs.isdir(base):
            return []
        return [int(m.group(1)) for p in self.fs.ls(base, detail=False)
                if (m := _VERSION_DIR.match(posixpath.basename(p.rstrip("/"))))]

    def _point_latest(self, dataset: str) -> None:
        """Set ``latest`` to the newest published version. Concurrent publishers may commit in any
        order; each writes the newest it sees and looks again after writing, so the last write of
        all names the newest version (a writer whose view was stale sees the newer one and rewrites)."""
        pointer = posixpath.join(self._root_path, dataset, LATEST_FILE)
        while True:
            newest = self.versions(dataset)[-1]
            self.storage.put(pointer, f"{newest}\n".encode())
            if self.versions(dataset)[-1] == newest and self.storage.read(pointer) == f"{newest}\n".encode():
                return


def _alive(claim: dict) -> bool:
    """Whether a claim's writer may still be publishing: a process of this host that is gone is
    not; another host's writer is given ``_TWIN_WAIT_S``."""
    if claim.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(claim.get("pid", -1)), 0)
    except (ProcessLookupError, ValueError, OverflowError):
        return False
    except PermissionError:
        pass
    return True


def _put_new_or_own(store: Store, path: str, data: bytes) -> bool:
    """``Store.put_new``, also True when the object there is this very write (a client that
    retried a PUT whose answer was lost is told the name exists; the bytes, unique to this
    writer, say whether it was its own)."""
    if store.put_new(path, data):
        return True
    try:
        return store.read(path) == data
    except FileNotFoundError:
        return False


def read_latest(fs, path: str, url: str) -> int:
    """The version number a ``latest`` pointer holds; anything else is a LatestPointerError saying how to mend it."""
    raw = fs.cat_file(path)
    text = raw.decode("utf-8", errors="replace").strip()
    if not re.fullmatch(r"[0-9]{1,18}", text):
        raise LatestPointerError(
            f"{url}: the latest pointer holds {raw[:80]!r}{'...' if len(raw) > 80 else ''}, not a version number; "
            f"write the newest published version into it: the highest v<N>/ holding a {MANIFEST_FILE} "
            f"(e.g. '3' for v3/)")
    return int(text)


def _pinned_files(m) -> list[str]:
    """The files a version directory holds beside its manifest.json (a mixture's holds none: it pins manifests)."""
    if not isinstance(m, Manifest):
        return []
    return [m.tokenizer.path, m.doc_index.path, *(s.path for s in m.shards), *(f.path for f in m.dedup_index)]


def load_manifest(url: str, *, expected_sha256: str | None = None, confined: bool = False, **storage_options) -> Published:
    """Load a manifest from ``.../v<N>``, ``.../v<N>/manifest.json`` or ``<root>/<dataset>`` (latest).
    ``confined``: its ``latest`` and ``manifest.json`` must not resolve outside the folder ``url``
    names through a symlink (``Store.escapes``); one that does is refused unread (``dedup_against``)."""
    return _load_as(Manifest, url, expected_sha256, storage_options, confined)


def _load_as(kind, url: str, expected_sha256: str | None, storage_options: dict, confined: bool = False) -> Published:
    """``kind.from_json`` (``Manifest`` or ``manifests.mixture.MixtureManifest``) of the manifest.json a URL names."""
    url = url.rstrip("/")
    store = Store.from_url(url, **storage_options)  # a local path is a local path, `::` in it too
    fs, path = store.fs, store.path(url)
    if path.endswith("/" + MANIFEST_FILE) or path == MANIFEST_FILE:
        url, path = url[: -len(MANIFEST_FILE) - 1], posixpath.dirname(path)
    root = url
    via_latest = not fs.exists(posixpath.join(path, MANIFEST_FILE)) and fs.exists(posixpath.join(path, LATEST_FILE))
    if via_latest:
        _confined(confined, join(url, LATEST_FILE), root, storage_options)
        version = read_latest(fs, posixpath.join(path, LATEST_FILE), join(url, LATEST_FILE))
        url, path = join(url, f"v{version}"), posixpath.join(path, f"v{version}")
    target = posixpath.join(path, MANIFEST_FILE)
    if not fs.exists(target):
        raise ManifestNotFoundError(f"no manifest at {url} (expected {join(url, MANIFEST_FILE)})")
    _confined(confined, join(url, MANIFEST_FILE), root, storage_options)
    manifest = kind.from_json(fs.cat_file(target), expected_sha256=expected_sha256, source=join(url, MANIFEST_FILE))
    return Published(manifest, url, Store.from_url(url, **storage_options) if storage_options else None)


def confined_file(url: str, root: str, store: Store | None = None) -> None:
    """Refuse (a ManifestError, before a byte is read) a file that a symlink takes outside ``root``,
    the folder a job named: a downloaded store may link to ~/.ssh (docs/security.md)."""
    target = (store or Store.from_url(url)).escapes(url, root)
    if target is not None:
        raise ManifestError(f"{url} is a symlink to {target}, outside {root} (symlink_outside_root); not read. "
                            "Copy the store instead of linking into it, or set follow_symlinks: true")


def _confined(confined: bool, url: str, root: str, storage_options: dict) -> None:
    if confined:
        confined_file(url, root, Store.from_url(url, **storage_options))
