"""The committed tier of the checkpoints: ``checkpoint.dir`` on any store the storage seam knows
(``s3://``, ``gs://``, a shared or local path), reached only through ``manifests.storage.Store``.

Layout (the same on every store)::

    <checkpoint.dir>/
        step-<N>/
            .metadata, __<r>_<n>.distcp   DCP files, each uploaded by the rank that wrote it
            rank-<r>.json                 rank r's manifest: sha256 and bytes of its files, uploaded after them
            meta.json                     the commit: created last, by rank 0, with the store's conditional create
        metrics.jsonl, samples.jsonl      the run's logs, uploaded after each commit (two tiers only)

A step directory without ``meta.json`` is an upload in progress or one cut short: never read, and
removed at the next start. Rank 0 creates ``meta.json`` (every file's sha256 and size) only once every
rank's manifest is on the store and every file it lists is there with its size; ``Store.put_new``
(S3 ``If-None-Match: *``, a local ``os.link``) creates it, never a rename, so a crash or kill at any
moment before leaves nothing a resume takes. Nothing here issues a collective: the upload and
commit run on background threads (trainer/checkpoint.py, ``Checkpointer``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import re
import shutil
import time

from gristmill.manifests import canonical_json, sha256_bytes, sha256_file
from gristmill.manifests.storage import Store, temp_name

from .errors import CheckpointError
from .meta import META_FILE, STEP_DIR, parse_meta

log = logging.getLogger("gristmill.trainer")

RANK_FILE = re.compile(r"^rank-(\d+)\.json$")
DCP_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # DCP's FileSystemWriter names: __<rank>_<n>.distcp
DCP_METADATA = ".metadata"  # written by DCP's coordinator, rank 0
RUN_FILES = ("metrics.jsonl", "samples.jsonl")  # the run's logs, kept beside the checkpoints


def rank_file(rank: int) -> str:
    return f"rank-{rank}.json"


def owner(rel: str) -> int | None:
    """The rank that wrote (and uploads) checkpoint file ``rel``; None for a name no rank writes."""
    if rel == DCP_METADATA:
        return 0
    m = DCP_FILE.match(rel) or RANK_FILE.match(rel)
    return int(m.group(1)) if m else None


def to_prune(steps: list[int], keep: int, keep_every: int) -> list[int]:
    """The committed steps retention removes: all but the newest ``keep`` and the milestones (steps that
    are multiples of ``keep_every``, when > 0)."""
    newest = set(sorted(steps)[-keep:])
    return [s for s in sorted(steps) if s not in newest and not (keep_every and s % keep_every == 0)]


class CheckpointStore:
    """The checkpoints under one URL. Methods are store I/O only (safe on a background thread)."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url.rstrip("/") or url
        self.store = Store.from_url(url, **(storage_options or {}))

    def __repr__(self) -> str:
        return f"CheckpointStore({self.url!r})"

    def is_dir(self, local_dir: str) -> bool:
        """Whether this is the local directory ``local_dir`` itself (one tier: nothing to upload)."""
        return self.store.is_local and os.path.realpath(self.store.path(self.url)) == os.path.realpath(local_dir)

    def step_url(self, step: int) -> str:
        return self.store.join(self.url, f"step-{step}")

    def file_url(self, step: int, rel: str) -> str:
        return self.store.join(self.step_url(step), rel)

    # -- listing ------------------------------------------------------------------------------
    def _names(self, url: str) -> list[str]:
        try:
            return self.store.listdir(url)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def steps(self) -> list[int]:
        """Every step directory, committed or not, oldest first."""
        return sorted(int(m.group(1)) for name in self._names(self.url) if (m := STEP_DIR.match(name)))

    def committed(self) -> list[int]:
        """The steps whose meta.json exists, oldest first."""
        return [s for s in self.steps() if self.store.exists(self.file_url(s, META_FILE))]

    def read_meta_bytes(self, step: int) -> bytes:
        try:
            return self.store.read(self.file_url(step, META_FILE))
        except FileNotFoundError:
            raise CheckpointError(f"{self.step_url(step)}: no {META_FILE}") from None

    def read_meta(self, step: int) -> dict:
        return parse_meta(self.read_meta_bytes(step), self.file_url(step, META_FILE))

    def sizes(self, step: int) -> dict[str, int]:
        """Name -> bytes of the objects in a step directory, listed now (one listing on an object store)."""
        fs, path = self.store.fs, self.store.path(self.step_url(step))
        fs.invalidate_cache(path)
        try:
            entries = fs.ls(path, detail=True)
        except FileNotFoundError:
            return {}
        return {posixpath.basename(e["name"].rstrip("/")): int(e["size"]) for e in entries if e.get("type") == "file"}

    # -- writing ------------------------------------------------------------------------------
    def upload(self, local_dir: str, step: int, rel: str) -> None:
        self.store.put_file(os.path.join(local_dir, rel), self.file_url(step, rel))

    def put(self, step: int, rel: str, data: bytes) -> None:
        self.store.put(self.file_url(step, rel), data)

    def gather_ranks(self, step: int, world_size: int, *, known: dict[int, bytes] | None = None, poll_s: float = 0.05,
                     say_every_s: float = 60.0) -> dict:
        """Wait until every rank's manifest is on the store, check every file each lists is there with its
        size, and return meta.json's ``files`` table (the rank manifests included). ``known``: manifests
        the caller already holds (rank 0's own), by rank: not read back."""
        known = known or {}
        waited_since, pause = time.monotonic(), poll_s
        said = waited_since
        while True:
            names = set(self._names(self.step_url(step)))
            missing = [r for r in range(world_size) if rank_file(r) not in names]
            if not missing:
                break
            if time.monotonic() - said > say_every_s:
                said = time.monotonic()
                log.info("step-%d: waiting %.0f s for the uploads of rank(s) %s", step, said - waited_since,
                         ", ".join(map(str, missing)))
            time.sleep(pause)
            pause = min(2.0, pause * 1.5)
        files: dict[str, dict] = {}
        for r in range(world_size):
            data = known[r] if r in known else self.store.read(self.file_url(step, rank_file(r)))
            manifest = json.loads(data)
            if manifest.get("step") != step or manifest.get("rank") != r or manifest.get("world_size") != world_size:
                raise CheckpointError(f"{self.file_url(step, rank_file(r))}: a manifest of step {manifest.get('step')}, "
                                      f"rank {manifest.get('rank')} of {manifest.get('world_size')}, not step {step}, "
                                      f"rank {r} of {world_size}")
            for rel, entry in manifest["files"].items():
                if owner(rel) != r or rel in files:
                    raise CheckpointError(f"{self.file_url(step, rank_file(r))}: lists {rel}, which rank {r} does not write")
                files[rel] = entry
            files[rank_file(r)] = {"sha256": sha256_bytes(data), "bytes": len(data)}
        sizes = self.sizes(step)
        wrong = [f"{rel} ({sizes.get(rel, 'missing')} bytes, {e['bytes']} expected)"
                 for rel, e in sorted(files.items()) if sizes.get(rel) != e["bytes"]]
        if wrong:
            raise CheckpointError(f"{self.step_url(step)}: not committed: " + "; ".join(wrong[:5]))
        return dict(sorted(files.items()))

    def commit(self, step: int, meta_bytes: bytes) -> None:
        """Create the step's meta.json, the commit; refuse if one exists (another writer, or a stale step)."""
        if not self.store.put_new(self.file_url(step, META_FILE), meta_bytes):
            raise CheckpointError(f"{self.step_url(step)}: a {META_FILE} already exists; another job writes "
                                  f"checkpoints to {self.url}? (each run needs its own checkpoint.dir)")

    def remove(self, step: int) -> None:
        """Remove a step directory, its meta.json first: from then on it is no checkpoint."""
        with contextlib.suppress(FileNotFoundError):
            self.store.rm(self.file_url(step, META_FILE))
        url = self.step_url(step)
        if self.store.is_local:
            shutil.rmtree(self.store.path(url), ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.store.fs.rm(self.store.path(url), recursive=True)

    def remove_uncommitted(self) -> list[int]:
        """Remove every step directory without a meta.json (an upload cut short): at a start, before
        any save of this run."""
        done = set(self.committed())
        gone = [s for s in self.steps() if s not in done]
        for step in gone:
            log.info("removing the uncommitted checkpoint %s", self.step_url(step))
            self.remove(step)
        return gone

    def prune(self, committed: list[int], keep: int, keep_every: int) -> list[int]:
        """Retention, after a commit, of the ``committed`` steps (the caller keeps the list: no listing per
        save): see :func:`to_prune`. Returns the steps removed."""
        gone = to_prune(committed, keep, keep_every)
        for step in gone:
            self.remove(step)
        return gone

    # -- reading back -------------------------------------------------------------------------
    def download(self, step: int, rel: str, local_dir: str) -> None:
        """Copy one file of a step to ``local_dir``, whole or not at all (a temp name, then a rename)."""
        check_file_name(rel, self.step_url(step))
        target = os.path.join(local_dir, rel)
        tmp = temp_name(target)
        try:
            with self.store.open(self.file_url(step, rel)) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def put_run_file(self, local_path: str) -> None:
        """Upload one of the run's logs beside the checkpoints, cut at its last complete line (the trainer
        may be appending to it meanwhile)."""
        try:
            with open(local_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        self.store.put(self.store.join(self.url, os.path.basename(local_path)), data[:data.rfind(b"\n") + 1])

    def get_run_file(self, local_path: str) -> bool:
        """Download the log uploaded beside the checkpoints to ``local_path`` (a resume in a fresh run dir
        continues it); False if there is none."""
        try:
            data = self.store.read(self.store.join(self.url, os.path.basename(local_path)))
        except FileNotFoundError:
            return False
        os.makedirs(os.path.dirname(local_path) or ".", exist_ok=True)
        with open(local_path, "wb") as f:
            f.write(data)
        return True


def check_file_name(rel: str, where: str) -> None:
    """A checkpoint file name from a meta.json or a manifest must be one a rank writes (never ``../x``)."""
    if not isinstance(rel, str) or owner(rel) is None:
        raise CheckpointError(f"{where}: lists {rel!r}, not a checkpoint file name (.metadata, __<r>_<n>.distcp, "
                              f"rank-<r>.json)")


def rank_manifest(step: int, rank: int, world_size: int, files: dict[str, dict]) -> bytes:
    return canonical_json({"step": step, "rank": rank, "world_size": world_size, "files": files})


def local_file_ok(path: str, entry: dict) -> bool:
    """Whether the local file ``path`` already holds ``entry`` (its bytes and sha256)."""
    if not os.path.isfile(path) or os.path.getsize(path) != entry.get("bytes"):
        return False
    return sha256_file(path)[0] == entry.get("sha256")
