"""Where ``gristmill serve`` finds a manifest: an index sha256 -> version URL over its stores.

The server is started with URLs of manifest store roots (``<root>``), datasets or mixtures
(``<root>/<name>``) or single versions (``<root>/<name>/v<N>``). :class:`Catalog` lists them
into an index of every published version's hash; a hash (or name) it does not know triggers a
rescan, at most once per ``rescan_interval_s``, so a version published after the start is
served without a restart. Published versions are immutable, so a version URL is read once.
"""
from __future__ import annotations

import collections
import logging
import posixpath
import threading
import time

from gristmill.errors import UsageError
from gristmill.manifests import ManifestError, ManifestStore
from gristmill.manifests.mixture import PublishedMixture, load_data, load_either
from gristmill.manifests.storage import Store
from gristmill.manifests.store import LATEST_FILE, MANIFEST_FILE, Published

log = logging.getLogger(__name__)

LOADED_MAX = 64  # loaded manifests kept (a mixture's with its components)


class UnknownManifest(UsageError):
    """No store of this server publishes the manifest asked for."""


class Catalog:
    def __init__(self, urls: list[str], *, storage_options: dict | None = None, rescan_interval_s: float = 2.0):
        if not urls:
            raise UsageError("gristmill serve needs at least one manifest store, dataset or mixture URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.storage_options = dict(storage_options or {})
        self.rescan_interval_s = rescan_interval_s
        self.by_sha: dict[str, str] = {}  # manifest sha256 -> version URL
        self.by_name: dict[str, dict[int, str]] = {}  # dataset / mixture name -> {version: URL}
        self._sha_of_url: dict[str, str] = {}  # version URL -> sha256 (a published version never changes)
        self._loaded: collections.OrderedDict[str, Published | PublishedMixture] = collections.OrderedDict()  # LRU
        self._lock = threading.Lock()
        self._last_scan = float("-inf")
        self.rescan(force=True)

    # -- the index ------------------------------------------------------------------------------
    def rescan(self, force: bool = False) -> bool:
        """List the stores again (unless the last scan is younger than ``rescan_interval_s``)."""
        with self._lock:
            if not force and time.monotonic() - self._last_scan < self.rescan_interval_s:
                return False
            self._last_scan = time.monotonic()
            for url in self.urls:
                try:
                    for name, version, vurl in self._versions(url):
                        self._index(name, version, vurl)
                except (OSError, ManifestError) as e:  # one unreadable store must not hide the others
                    log.warning("listing %s failed: %s", url, e)
            return True

    def _versions(self, url: str):
        """(name, version, version URL) of every published version under ``url``."""
        store = Store.from_url(url, **self.storage_options)  # the one way to storage (manifests/storage.py)
        path = store.path(url)
        if store.exists(store.join(path, MANIFEST_FILE)):  # one version
            parent, v = posixpath.split(path.rstrip("/"))
            yield posixpath.basename(parent), int(v[1:]) if v[1:].isdigit() else 0, url
            return
        if store.exists(store.join(path, LATEST_FILE)):  # one dataset or mixture: <root>/<name>
            root, name = url.rsplit("/", 1)
            store, names = ManifestStore(root, **self.storage_options), [name]
        else:  # a store root
            store = ManifestStore(url, **self.storage_options)
            names = store.datasets()
        for name in names:
            for v in store.versions(name):
                yield name, v, store.version_url(name, v)

    def _index(self, name: str, version: int, url: str) -> None:
        if url not in self._sha_of_url:
            self._sha_of_url[url] = load_either(url, **self.storage_options).manifest.sha256
        self.by_sha[self._sha_of_url[url]] = url
        self.by_name.setdefault(name, {})[version] = url

    # -- lookups --------------------------------------------------------------------------------
    def url_of(self, sha256: str) -> str:
        if sha256 not in self.by_sha:
            self.rescan()
        if sha256 not in self.by_sha:
            raise UnknownManifest(f"unknown manifest {sha256}: no version under {', '.join(self.urls)} has this hash")
        return self.by_sha[sha256]

    def load(self, sha256: str) -> Published | PublishedMixture:
        """The loaded version (a mixture with its components), hash-checked; kept for the next request."""
        with self._lock:
            if sha256 in self._loaded:
                self._loaded.move_to_end(sha256)
                return self._loaded[sha256]
        pub = load_data(self.url_of(sha256), expected_sha256=sha256, **self.storage_options)
        with self._lock:
            self._loaded[sha256] = pub
            while len(self._loaded) > LOADED_MAX:
                self._loaded.popitem(last=False)
            return pub

    def latest_sha(self, name: str) -> str:
        """The hash of a dataset's or mixture's newest version (rescanned: ``latest`` moves)."""
        self.rescan()
        versions = self.by_name.get(name)
        if not versions:
            raise UnknownManifest(f"unknown dataset or mixture {name[:100]!r}; served: {', '.join(sorted(self.by_name))}")
        url = versions[max(versions)]
        return self._sha_of_url[url]

