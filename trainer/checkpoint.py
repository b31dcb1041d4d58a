"""Checkpoints: DCP shards plus a ``meta.json`` that ties the weights to the exact data they saw.

Two tiers (docs/trainer.md, "Checkpoints", has every step and field)::

    <checkpoint.local_dir>/step-<N>/      each rank's DCP files, written first; training resumes after this
        .metadata, __<rank>_0.distcp      torch.distributed.checkpoint files (model, optimizer, scheduler, loader, train state: trainer/state.py)
        rank-<r>.json                     rank r's manifest (sha256 and bytes of its files)
        meta.json                         step, data manifest, loader state, RNG, config, run record, sha256 of files
    <checkpoint.dir>/step-<N>/            the same files uploaded in the background (trainer/checkpoint_store.py);
                                          meta.json created last, by rank 0, with the store's conditional create

With ``checkpoint.dir`` the local directory itself (the default) the two are one and nothing is
uploaded. A step directory without meta.json is never read, and the next start deletes it: a crash
at any point before the create leaves nothing a resume would take. Resume walks committed
checkpoints newest first, makes a local copy of each (kept when its meta.json is the store's, else
downloaded) and takes the first that verifies: meta.json intact (trainer/meta.py), every file
matching its sha256, and the data position stored in the DCP state equal to meta.json's.

DCP's ``.metadata`` is a pickle, and the non-tensor entries of the state (optimizer
hyper-parameters) are ``torch.save`` blobs: a checkpoint is untrusted input, so both are read
only through restricted unpicklers (:class:`SafeReader`, :class:`SafeLoadPlanner`), never
through ``pickle.load`` or ``torch.load(weights_only=False)``.
"""
from __future__ import annotations

import base64
import collections
import contextlib
import datetime as dt
import io
import json
import logging
import os
import pathlib
import pickle
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
import zipfile
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.filesystem as dcp_fs
import torch.distributed.checkpoint.metadata as dcp_md
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.stateful import Stateful

import gristmill
from gristmill.manifests import sha256_file
from gristmill.manifests.storage import atomic_write

from .cadence import Cadence
from .checkpoint_store import (RANK_FILE, CheckpointStore, check_file_name, local_file_ok, owner, rank_file,
                               rank_manifest)
from .errors import CheckpointError
from .meta import (DCP_KEY, META_FILE, STEP_DIR, compare_data_position, encode_data_position, parse_meta, read_meta,
                   seal_meta)

log = logging.getLogger("gristmill.trainer")

TMP_PREFIX = ".tmp-"


# -- paths ----------------------------------------------------------------------------------
def checkpoints_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def committed(run_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every committed checkpoint in ``<run_dir>/checkpoints``, oldest first."""
    return committed_in(checkpoints_dir(run_dir))


def committed_in(root: str) -> list[tuple[int, str]]:
    """(step, path) of every committed checkpoint (a step-<N> directory holding meta.json) in the
    local directory ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    found = [(int(m.group(1)), os.path.join(root, name)) for name in os.listdir(root)
             if (m := STEP_DIR.match(name)) and os.path.exists(os.path.join(root, name, META_FILE))]
    return sorted(found)


# -- RNG ------------------------------------------------------------------------------------
def _bytes_b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _b64_bytes(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def rng_state() -> dict:
    """This rank's Python, NumPy, torch CPU and (when present) CUDA generator states, as plain JSON
    (no pickle: a checkpoint's metadata must be safe to read)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
             "torch": _bytes_b64(torch.get_rng_state())}
    if torch.cuda.is_available():
        state["cuda"] = _bytes_b64(torch.cuda.get_rng_state())
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_b64_bytes(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_b64_bytes(state["cuda"]))


# -- metadata -------------------------------------------------------------------------------
def library_versions() -> dict:
    out = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
           "gristmill": gristmill.__version__}
    for name in ("pyarrow", "flash-attn"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def checkpoint_files(directory: str) -> list[str]:
    """Relative paths of every file under ``directory`` except meta.json, sorted."""
    out = []
    for root, _, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if rel != META_FILE:
                out.append(rel)
    return sorted(out)


def file_checksums(directory: str, files: list[str] | None = None) -> dict[str, dict]:
    """sha256 and size of ``files`` (default: all but meta.json) under ``directory``, by relative path."""
    out = {}
    for rel in checkpoint_files(directory) if files is None else files:
        sha, size = sha256_file(os.path.join(directory, rel))
        out[rel] = {"sha256": sha, "bytes": size}
    return out


def collective_checksums(directory: str, rank: int, world_size: int) -> dict[str, dict]:
    """``file_checksums`` with the hashing split across ranks (rank r hashes every W-th file), so a
    large checkpoint is hashed in 1/W of the time. Every rank returns the whole result."""
    mine = file_checksums(directory, checkpoint_files(directory)[rank::world_size])
    parts = [None] * world_size
    dist.all_gather_object(parts, mine)
    return dict(sorted(kv for part in parts for kv in part.items()))


# -- reading DCP without unpickling untrusted data -------------------------------------------
# What a DCP .metadata pickle may name: the checkpoint-metadata dataclasses, torch.Size, the
# dtype/layout lookups they use, and the path type of StorageMeta.checkpoint_id. Containers,
# strings and numbers need no global. Anything else (os.system, builtins.eval, ...) is refused.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_md, name)
    for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                 "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): dcp_fs._StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib._local", "PosixPath"): pathlib.PosixPath,  # Python 3.13's module name
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, f, where: str):
        super().__init__(f)
        self.where = where

    def find_class(self, module: str, name: str):
        found = _METADATA_GLOBALS.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        if found is None:
            raise CheckpointError(
                f"{self.where}: refusing to unpickle {module}.{name}: DCP metadata may only hold "
                f"torch.distributed.checkpoint metadata classes, torch.Size and dtypes (a forged checkpoint?)")
        return found


def read_dcp_metadata(path: str) -> dcp_md.Metadata:
    """The DCP ``.metadata`` of checkpoint directory ``path``, through the restricted unpickler."""
    where = os.path.join(path, ".metadata")
    try:
        with open(where, "rb") as f:
            md = _MetadataUnpickler(f, where).load()
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: no DCP .metadata") from e
    except CheckpointError:
        raise
    except Exception as e:  # a truncated or garbled pickle
        raise CheckpointError(f"{where}: not a readable DCP metadata file: {type(e).__name__}: {e}") from e
    if not isinstance(md, dcp_md.Metadata):
        raise CheckpointError(f"{where}: holds a {type(md).__name__}, not DCP Metadata")
    check_storage_entries(path, md)
    return md


DCP_DATA_FILE = re.compile(r"^__\d+_\d+\.distcp$")  # the names DCP's FileSystemWriter gives its data files


def check_storage_entries(path: str, md: dcp_md.Metadata) -> None:
    """Every DCP storage entry must lie inside a data file of this checkpoint directory: a plain
    ``__<rank>_<n>.distcp`` name (never ``../step-2/...``, an absolute path or a sub-directory), a regular
    file (not a link), and ``offset + length`` within its size. Entries with stream transforms
    (DCP's zstd extension) are refused: this trainer writes none, and a transform's output is not
    bounded by the file's size (a decompression bomb). Called by every read of the DCP metadata, so
    verify, the audit and resume all refuse the same entries."""
    where = os.path.join(path, ".metadata")
    storage = md.storage_data
    if not isinstance(storage, dict):
        raise CheckpointError(f"{where}: storage_data is a {type(storage).__name__}, not DCP's entry table")
    sizes: dict[str, int] = {}
    for index, info in storage.items():
        fqn = getattr(index, "fqn", index)
        if not isinstance(info, dcp_fs._StorageInfo):
            raise CheckpointError(f"{where}: the storage entry of {fqn!r} is a {type(info).__name__}, not DCP's")
        rel = info.relative_path
        if not (isinstance(rel, str) and DCP_DATA_FILE.match(rel)):
            raise CheckpointError(f"{where}: the storage entry of {fqn!r} points at {rel!r}, not a data file of this "
                                  f"checkpoint (__<rank>_<n>.distcp inside {path}): a forged or spliced checkpoint")
        if info.transform_descriptors:
            raise CheckpointError(f"{where}: the storage entry of {fqn!r} has stream transforms "
                                  f"{list(info.transform_descriptors)!r}; this trainer writes none (refused: their output "
                                  f"is unbounded)")
        if rel not in sizes:
            full = os.path.join(path, rel)
            if os.path.islink(full) or not os.path.isfile(full):
                raise CheckpointError(f"{where}: the storage entry of {fqn!r} names {rel}, which is "
                                      f"{'a link' if os.path.islink(full) else 'not a regular file'} in {path}")
            sizes[rel] = os.path.getsize(full)
        offset, length = info.offset, info.length
        if not (type(offset) is int and type(length) is int and 0 <= offset and 0 <= length
                and offset + length <= sizes[rel]):
            raise CheckpointError(f"{where}: the storage entry of {fqn!r} spans bytes {offset!r}+{length!r} of {rel}, "
                                  f"outside its {sizes[rel]} bytes")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, with ``.metadata`` read through the restricted unpickler."""

    def read_metadata(self, *args, **kwargs) -> dcp_md.Metadata:
        if kwargs.get("rank") is not None:  # rank-local metadata files: never written by this trainer
            raise CheckpointError(f"{self.path}: rank-local DCP metadata is not supported")
        md = read_dcp_metadata(str(self.path))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = dcp_md.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


    def _slice_file(self, file, sinfo):
        """An entry's bytes, after checking that they are what torch.save writes: a zip archive whose
        members are all stored uncompressed inside the entry. torch.load would inflate a deflated
        member however large it claims to be (a decompression bomb), so nothing read from an entry
        can exceed the entry's own length, which :func:`check_storage_entries` bounds by the file."""
        check_stored_zip(_Window(file, sinfo.offset, sinfo.length), sinfo.length,
                         f"{self.path}/{sinfo.relative_path}@{sinfo.offset}")
        return super()._slice_file(file, sinfo)


class _Window(io.RawIOBase):
    """Bytes [offset, offset + length) of a seekable file, as a file (for zipfile: DCP's own view
    mishandles seeks from the end)."""

    def __init__(self, f, offset: int, length: int):
        super().__init__()
        self.f, self.offset, self.length, self.pos = f, offset, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}[whence]
        self.pos = min(max(0, base + pos), self.length)
        return self.pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self.length - self.pos))
        self.f.seek(self.offset + self.pos)
        got = self.f.readinto(memoryview(b)[:n]) if n else 0
        self.pos += got
        return got


def check_stored_zip(f, length: int, where: str) -> None:
    """Refuse a torch.save blob (a zip) of ``length`` bytes holding a compressed member, or one whose
    members do not fit inside it."""
    try:
        members = zipfile.ZipFile(f).infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise CheckpointError(f"{where}: a DCP entry that is not a torch.save archive: {e}") from None
    for m in members:
        if m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size or m.header_offset + m.file_size > length:
            raise CheckpointError(f"{where}: DCP entry member {m.filename!r} is compressed or larger than its entry "
                                  f"({m.compress_size} bytes stored, {m.file_size} claimed, entry {length} bytes); "
                                  f"torch.save stores members uncompressed (a decompression bomb?)")


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, with non-tensor entries (optimizer hyper-parameters) read by torch's
    weights-only unpickler instead of ``torch.load(weights_only=False)``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            found = re.search(r"GLOBAL (\S+)", str(e))  # torch names the global it would not load
            what = found.group(1) if found else "it"
            raise CheckpointError(f"DCP entry {read_item.dest_index.fqn}: refusing to unpickle {what}: only tensors, "
                                  f"numbers, strings and containers may be stored (a forged checkpoint?)") from e
        # As DefaultLoadPlanner.load_bytes, minus its weights_only=False.
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_state(state: dict, path: str, *, no_dist: bool = False) -> None:
    """Load ``state`` in place from checkpoint ``path`` through the restricted readers (``no_dist``: this
    process alone, no collectives)."""
    with warnings.catch_warnings():
        # A local read (the audit, verify) is meant to be single-process; DCP warns that it assumed so.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        try:
            dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner(), no_dist=no_dist)
        except dcp.api.CheckpointException as e:
            # DCP wraps each rank's exception; a refusal of ours is the message to show, not its traceback.
            ours = [exc for exc, _ in e.failures.values() if isinstance(exc, CheckpointError)]
            if ours:
                raise ours[0] from None
            raise


MAX_POSITION_BYTES = 1 << 20  # the data position is a few hundred bytes of JSON; refuse a forged giant


def _position_buffer(path: str, md: dcp_md.Metadata) -> torch.Tensor:
    """An empty tensor shaped like the checkpoint's data-position entry, to load it into."""
    entry = md.state_dict_metadata.get(DCP_KEY)
    if (not isinstance(entry, dcp_md.TensorStorageMetadata) or len(entry.size) != 1
            or entry.properties.dtype != torch.uint8 or entry.size[0] > MAX_POSITION_BYTES):
        raise CheckpointError(f"{path}: the DCP state has no {DCP_KEY} entry of uint8 bytes "
                              f"(not written by this trainer?)")
    return torch.empty(entry.size, dtype=torch.uint8)


# The Stateful entries every checkpoint of this trainer holds (trainer/state.py, Trainer.states).
STATES = ("model", "optimizer", "scheduler", "loader", "train_state")
# Those whose values meta.json also records: read back (small byte entries) and compared with it.
CROSS_CHECKED = ("loader", "train_state")


def _missing_states(path: str, md: dcp_md.Metadata, states=STATES) -> None:
    saved = {fqn.split(".", 1)[0] for fqn in md.state_dict_metadata}
    missing = sorted(set(states) - saved)
    if missing:
        raise CheckpointError(f"{path}: the DCP state has no {', '.join(missing)} entries (written by an older "
                              f"trainer?); start a new run directory or resume with the trainer that wrote it")


def read_cross_checked(path: str, md: dcp_md.Metadata | None = None) -> dict:
    """The DCP state's data position (bytes) and its loader and train-state entries (dicts), read
    locally (no collectives) without touching the model or optimizer tensors."""
    md = read_dcp_metadata(path) if md is None else md
    state: dict = {DCP_KEY: _position_buffer(path, md), **{name: {} for name in CROSS_CHECKED}}
    for fqn, entry in md.state_dict_metadata.items():
        name, *keys = fqn.split(".")
        if name in CROSS_CHECKED:
            if not isinstance(entry, dcp_md.BytesStorageMetadata) or not keys:
                raise CheckpointError(f"{path}: DCP entry {fqn} is not a plain value of the {name} state "
                                      f"(not written by this trainer?)")
            d = state[name]
            for k in keys[:-1]:  # DCP flattens nested dicts to dotted names
                d = d.setdefault(k, {})
                if not isinstance(d, dict):
                    raise CheckpointError(f"{path}: DCP entry {fqn} clashes with another entry of the {name} state")
            d[keys[-1]] = None
    load_state(state, path, no_dist=True)
    return {**state, DCP_KEY: state[DCP_KEY].numpy().tobytes()}


def compare_states(meta: dict, path: str, step, loader: dict | None) -> None:
    """The step and loader position restored from the DCP state must be meta.json's (both were
    written by the same save; a difference means the files were tampered with or mixed up)."""
    where = os.path.join(path, META_FILE)
    if step != meta["step"]:
        raise CheckpointError(f"{where}: step {meta['step']} but the DCP train state says {step}")
    saved = dict(loader or {})
    if json.loads(json.dumps(saved, sort_keys=True)) != json.loads(json.dumps(meta["loader"], sort_keys=True)):
        raise CheckpointError(f"{where}: loader {meta['loader']} differs from the DCP loader state {saved}")


def check_dcp_state(path: str, meta: dict) -> None:
    """What the DCP state must agree on with meta.json, for verify, the audit and resume alike: every
    state the trainer saves is there, and the data position, the loader state and the step inside it
    are meta.json's (a consistent, re-sealed edit of meta.json and of one of these copies is still
    caught by the others)."""
    md = read_dcp_metadata(path)
    _missing_states(path, md)
    got = read_cross_checked(path, md)
    compare_data_position(meta, got[DCP_KEY], os.path.join(path, META_FILE))
    compare_states(meta, path, got["train_state"].get("step"), got["loader"])


def _irregular(path: str) -> list[str]:
    """Links and non-regular files under a checkpoint directory: a checkpoint holds only its own files."""
    out = []
    for root, dirs, names in os.walk(path):
        for name in dirs + names:
            full = os.path.join(root, name)
            if os.path.islink(full) or not (os.path.isdir(full) or os.path.isfile(full)):
                out.append(f"{full}: {'a link' if os.path.islink(full) else 'not a regular file'}; a checkpoint "
                           f"holds only its own regular files")
    return out


def verify(path: str, actual: dict[str, dict] | None = None) -> list[str]:
    """Problems with a committed checkpoint (empty when it can be trusted): meta.json intact and
    consistent, only regular files, every file matching its recorded sha256, and (once the files
    match) the DCP metadata safe to read, every storage entry inside this directory's data files
    (:func:`check_storage_entries`) and the DCP state agreeing with meta.json (:func:`check_dcp_state`).
    The one check resume (:func:`find_resumable`) and ``audit --verify-checkpoint`` both run.
    ``actual`` is the directory's ``file_checksums`` when the caller already computed them."""
    try:
        meta = read_meta(path)
    except CheckpointError as e:
        return [str(e)]
    problems = _irregular(path)
    if problems:
        return problems
    recorded = meta.get("files", {})
    if not isinstance(recorded, dict) or not all(isinstance(v, dict) and "sha256" in v for v in recorded.values()):
        return [f"{path}/{META_FILE}: files is not a table of file -> sha256"]
    actual = file_checksums(path) if actual is None else actual
    for rel, want in recorded.items():
        got = actual.get(rel)
        if got is None:
            problems.append(f"{path}/{rel}: missing")
        elif got["sha256"] != want["sha256"]:
            problems.append(f"{path}/{rel}: sha256 {got['sha256']} does not match meta.json's {want['sha256']}")
    problems += [f"{path}/{rel}: not listed in meta.json" for rel in sorted(set(actual) - set(recorded))]
    if not recorded:
        problems.append(f"{path}: meta.json lists no files")
    if not problems:
        try:
            check_dcp_state(path, meta)
        except CheckpointError as e:
            problems.append(str(e))
    return problems


def verify_copy(url: str, storage_options: dict | None = None) -> list[str]:
    """:func:`verify` of a committed checkpoint on any store (``s3://.../step-<N>``, opened with
    ``storage_options``): its meta.json and the files it lists are downloaded to a temporary directory
    first (the DCP metadata is read only there, through the restricted unpickler, like any other)."""
    parent, name = url.rstrip("/").rsplit("/", 1)
    m = STEP_DIR.match(name)
    if not m:
        return [f"{url}: not a step-<N> checkpoint directory"]
    store, step = CheckpointStore(parent, storage_options), int(m.group(1))
    with tempfile.TemporaryDirectory(prefix="gristmill-verify-") as tmp:
        try:
            meta_bytes = store.read_meta_bytes(step)
            files = parse_meta(meta_bytes, store.file_url(step, META_FILE)).get("files")
            for rel in files if isinstance(files, dict) else {}:
                store.download(step, rel, tmp)
        except (CheckpointError, OSError) as e:
            return [str(e)]
        atomic_write(os.path.join(tmp, META_FILE), meta_bytes)
        return [p.replace(tmp, url) for p in verify(tmp)]


def find_resumable(run_dir: str, checksums=file_checksums) -> tuple[str | None, list[str]]:
    """The newest committed checkpoint that verifies, and why any newer ones were passed over."""
    passed_over = []
    for step, path in reversed(committed(run_dir)):
        problems = verify(path, checksums(path))
        if not problems:
            return path, passed_over
        passed_over.append(f"step-{step}: " + "; ".join(problems[:3]))
    return None, passed_over


# -- save -----------------------------------------------------------------------------------
def _position_tensor(data: bytes) -> torch.Tensor:
    # A plain (replicated) tensor: DCP writes it once, and its bytes land in a file meta.json hashes.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _remove_local(path: str) -> None:
    """Remove a local checkpoint directory, its meta.json first (from then on it is no checkpoint)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, META_FILE))
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Upload:
    """One rank's background upload of one save (and, on rank 0, its commit)."""

    step: int
    thread: threading.Thread | None = None
    error: BaseException | None = None
    seconds: float | None = None  # from the start of the save to the end of this rank's upload (and commit)


class Checkpointer:
    """Saves, uploads, commits, prunes and restores the checkpoints of one run, and says when a save is
    due. Two tiers: each rank writes its DCP shards to ``local_dir`` (training resumes once that local
    write is done), a background thread per rank uploads them to ``dir_url`` (trainer/checkpoint_store.py)
    and rank 0's thread commits once every rank's files are there. With ``dir_url`` the local directory
    itself (the default) there is nothing to upload and the same commit runs in place. One upload is in
    flight per rank: a save waits for the previous one only while it still runs, and says so. Collective
    (save, latest, load): every rank calls it; the background threads issue no collective."""

    def __init__(self, dir_url: str, *, local_dir: str, keep: int, async_save: bool, rank: int, world_size: int,
                 device: torch.device, storage_options: dict | None = None, keep_every: int = 0,
                 local_rank: int = 0, local_world_size: int = 1, hooks=None, enabled: bool = True,
                 cadence: Cadence | None = None, run_files: tuple[str, ...] = ()):
        """``hooks`` (trainer.hooks.Hooks): ``before_commit(step, local_dir)`` runs on rank 0 before meta.json
        is created, ``upload(step, rank, file, local_dir)`` on each rank before each file's upload (tests
        stall or crash there). ``local_rank``/``local_world_size``: the ranks sharing ``local_dir`` (a node's)
        split the downloads of a resume. ``run_files``: the run's logs, uploaded beside the checkpoints."""
        self.remote = CheckpointStore(dir_url, storage_options)
        self.local_dir, self.two_tier = local_dir, not self.remote.is_dir(local_dir)
        self.keep, self.keep_every, self.async_save = keep, keep_every, async_save
        self.enabled = enabled
        self.cadence = cadence or Cadence(0, mtbf_s=1.0, first_steps=1)
        self.last_step = 0  # the step of the newest save or loaded checkpoint (0: the initial weights)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.before_commit = getattr(hooks, "before_commit", None)
        self.upload_hook = getattr(hooks, "upload", None)
        self.run_files = run_files if self.two_tier else ()
        self.upload: Upload | None = None
        self.previous_step: int | None = None  # the save before the one in flight (committed once this one runs)
        # Async writes run collectives from a background thread: give them their own gloo group so
        # they never interleave with the training step's collectives.
        self._async_group = dist.new_group(backend="gloo") if async_save else None
        self.committed: list[int] = []  # rank 0: the committed steps on the store, kept as saves commit and prune
        if enabled:
            if local_rank == 0:
                self._remove_uncommitted_local()
            if rank == 0:
                if self.two_tier:
                    self.remote.remove_uncommitted()
                self.committed = self.remote.committed()
        dist.barrier()

    def local_step_dir(self, step: int) -> str:
        return os.path.join(self.local_dir, f"step-{step}")

    def _remove_uncommitted_local(self) -> None:
        if not os.path.isdir(self.local_dir):
            return
        for name in os.listdir(self.local_dir):
            path = os.path.join(self.local_dir, name)
            # an interrupted save (and the temp dirs of trainers before two tiers): never valid
            if name.startswith(TMP_PREFIX) or (STEP_DIR.match(name) and not os.path.exists(os.path.join(path, META_FILE))):
                log.info("removing interrupted checkpoint %s", path)
                shutil.rmtree(path, ignore_errors=True)

    def newest(self) -> str | None:
        """Where the newest committed checkpoint is (a URL with two tiers), or None."""
        steps = self.remote.committed() if self.enabled else []
        return self.remote.step_url(steps[-1]) if steps else None

    def source_of(self, path: str) -> str:
        """The committed checkpoint a local copy ``path`` was taken from (what meta.json's resumed_from names)."""
        return self.remote.step_url(int(STEP_DIR.match(os.path.basename(path)).group(1))) if self.two_tier else path

    # -- cadence --------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """A save after optimizer step ``step`` is due (``checkpoint.every`` steps, or auto: trainer/cadence.py)."""
        return self.enabled and self.cadence.due(step)

    def due_at_end(self, step: int) -> bool:
        """The end of the run (or of this slice of it) is always checkpointed, unless it already is
        (or no step was trained past the newest checkpoint)."""
        return self.enabled and step > self.last_step

    # -- save -----------------------------------------------------------------------------------
    def save(self, step: int, states: dict[str, Stateful], meta: dict) -> dict:
        """Write step ``step`` of ``states`` (trainer.state: model, optimizer, scheduler, loader, train
        state; DCP reshards them on load) to the local directory and start its upload and commit in the
        background. Returns ``blocked_s`` (the seconds training was blocked: the local write, or only DCP's
        staging copy with async_save, plus any wait) and ``waited_s`` (of that, waiting for the previous
        upload)."""
        started = time.perf_counter()
        waited = self.wait(reason=f"the step-{step} save")  # one upload in flight
        self.last_step = step
        staging = self.local_step_dir(step)
        for later in [s for s in self.committed if s >= step] if self.rank == 0 else ():
            # of an abandoned lineage (this run resumed from before it, or does not resume): never
            # kept in favour of this run's saves, which it would outlive by step number
            log.warning("removing checkpoint step-%d: this run, at step %d, did not resume from it", later, step)
            self.remote.remove(later)
            self.committed.remove(later)
        if self.local_rank == 0:
            for later, path in committed_in(self.local_dir) if self.two_tier else ():
                if later >= step:  # local copies of that lineage too: a resume must never prefer them
                    _remove_local(path)
            _remove_local(staging)
            os.makedirs(staging, exist_ok=True)  # every node's local rank 0 does this: local_dir may be shared
        dist.barrier()
        rngs = [None] * self.world_size
        dist.all_gather_object(rngs, rng_state())
        meta = {**meta, "rng": rngs}
        state = {**states, DCP_KEY: _position_tensor(encode_data_position(meta))}
        future = None
        if self.async_save:
            future = dcp.async_save(state, checkpoint_id=staging, process_group=self._async_group)
        else:
            dcp.save(state, checkpoint_id=staging)
        self.upload = Upload(step)
        self.upload.thread = threading.Thread(target=self._upload, args=(self.upload, staging, meta, future, started),
                                              name=f"checkpoint-upload-{step}", daemon=True)
        self.upload.thread.start()
        return {"blocked_s": time.perf_counter() - started, "waited_s": waited}

    def _upload(self, up: Upload, staging: str, meta: dict, future, started: float) -> None:
        """The background part of a save, on each rank: its files hashed and uploaded, then its manifest;
        on rank 0 then the commit. Store I/O only: no collective."""
        try:
            if future is not None:
                future.result()  # DCP's async write (on its own process group) is done
            step = up.step
            mine = [rel for rel in checkpoint_files(staging) if owner(rel) == self.rank and not RANK_FILE.match(rel)]
            files = file_checksums(staging, mine)
            for rel in mine:
                if self.upload_hook is not None:
                    self.upload_hook(step, self.rank, rel, staging)
                if self.two_tier:
                    self.remote.upload(staging, step, rel)
            manifest = rank_manifest(step, self.rank, self.world_size, files)
            if self.two_tier:  # the local copy is complete too (a resume prefers it when identical)
                atomic_write(os.path.join(staging, rank_file(self.rank)), manifest)
            self.remote.put(step, rank_file(self.rank), manifest)  # last: this rank's part is on the store
            if self.rank == 0:
                self._commit(step, staging, meta, started, manifest)
            if self.two_tier and self.local_rank == 0 and self.previous_step is not None:
                self._prune_local(self.previous_step)
            up.seconds = time.perf_counter() - started
        except BaseException as e:  # noqa: BLE001 - handed to the training thread (wait / poll raise it)
            up.error = e

    def _commit(self, step: int, staging: str, meta: dict, started: float, manifest: bytes) -> None:
        files = self.remote.gather_ranks(step, self.world_size, known={0: manifest})
        meta = {**meta, "files": files, "save_seconds": round(time.perf_counter() - started, 3),
                "created_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()}
        _, data = seal_meta(meta)
        if self.before_commit is not None:
            self.before_commit(step, staging)
        self.remote.commit(step, data)  # the commit: meta.json created, last
        if self.two_tier:
            atomic_write(os.path.join(staging, META_FILE), data)
        self.committed.append(step)
        for gone in self.remote.prune(self.committed, self.keep, self.keep_every):
            self.committed.remove(gone)
            log.info("removed checkpoint step-%d (checkpoint.keep=%d, keep_every=%d)", gone, self.keep, self.keep_every)
        for path in self.run_files:
            self.remote.put_run_file(path)
        log.info("committed checkpoint %s (%d files)", self.remote.step_url(step), len(files))

    def _prune_local(self, keep_from: int) -> None:
        """Local copies older than ``keep_from`` (the newest committed one stays, for a fast resume)."""
        for name in os.listdir(self.local_dir):
            m = STEP_DIR.match(name)
            if m and int(m.group(1)) < keep_from:
                _remove_local(os.path.join(self.local_dir, name))

    def poll(self) -> None:
        """Raise a failed background upload on the training thread (no collective; called every step)."""
        if self.upload is not None and self.upload.error is not None:
            self.wait()

    def wait(self, reason: str = "") -> float:
        """Block until this rank's upload in flight (and, on rank 0, its commit) is done; raise its error.
        Returns the seconds waited, said in the log when ``reason`` names who waits."""
        up, self.upload = self.upload, None
        if up is None:
            return 0.0
        t0 = time.perf_counter()
        if up.thread.is_alive() and reason:
            log.info("rank %d: %s waits for the upload of step-%d, still running", self.rank, reason, up.step)
        up.thread.join()
        waited = time.perf_counter() - t0
        self.previous_step = up.step
        if up.error is not None:
            raise CheckpointError(f"checkpoint step-{up.step} was not committed: {type(up.error).__name__}: "
                                  f"{up.error}") from up.error
        if reason and waited > 0.001:
            log.info("rank %d: waited %.2f s for the step-%d upload", self.rank, waited, up.step)
        if not reason:
            for path in self.run_files if self.rank == 0 else ():
                self.remote.put_run_file(path)  # the end (or a stop): the logs' last lines too
        return waited

    # -- restore --------------------------------------------------------------------------------
    def latest(self) -> tuple[str | None, dict | None]:
        """The newest committed checkpoint that verifies, as a local directory: the committed steps on the
        store and the local copies, newest first; a local copy whose meta.json is the store's is used as
        it is (after verifying), anything else is downloaded (split among the ranks sharing local_dir)
        and verified (the hashing split among all ranks). A checkpoint that does not verify is logged
        and passed over. Rank 0 decides; every rank gets the path and meta."""
        listing = [None, None]
        if self.rank == 0:
            remote = self.remote.committed() if self.two_tier else []
            local = [s for s, _ in committed_in(self.local_dir)]
            listing = [sorted(set(remote) | set(local), reverse=True), set(remote)]
        dist.broadcast_object_list(listing, src=0)
        for step in listing[0]:
            problems = self._try(step, step in listing[1])
            if not problems:
                path = self.local_step_dir(step)
                if self.rank == 0:
                    for name in self.run_files:
                        if not os.path.exists(name) and self.remote.get_run_file(name):
                            log.info("continuing %s from %s", name, self.remote.url)
                return path, read_meta(path)
            if self.rank == 0:
                log.warning("not resuming from step-%d: %s", step, "; ".join(problems[:3]))
        return None, None

    def _try(self, step: int, on_store: bool) -> list[str]:
        """Make a verified local copy of committed ``step``; the problems that prevent it (same on every rank)."""
        meta_bytes = [None]
        if self.rank == 0 and on_store:
            try:
                meta_bytes[0] = self.remote.read_meta_bytes(step)
            except (CheckpointError, OSError) as e:
                meta_bytes[0] = str(e)
        dist.broadcast_object_list(meta_bytes, src=0)
        if isinstance(meta_bytes[0], str):
            return [meta_bytes[0]]
        if not on_store:  # a local copy alone (not on the store): only if every rank's node holds one
            here = torch.tensor([int(os.path.isfile(os.path.join(self.local_step_dir(step), META_FILE)))],
                                device=self.device)
            dist.all_reduce(here, op=dist.ReduceOp.MIN)
            if not here.item():
                return [f"step-{step} is not on {self.remote.url} and not in every node's {self.local_dir}"]
        problems: list[str] = []
        for download_all in ((False, True) if on_store else (False,)):  # a bad local copy: once more from the store
            path = self.local_step_dir(step)
            try:
                if on_store:
                    self._materialize(step, meta_bytes[0], download_all)
                problems = verify(path, collective_checksums(path, self.rank, self.world_size))
            except (CheckpointError, OSError) as e:
                problems = [f"{type(e).__name__}: {e}" if isinstance(e, OSError) else str(e)]
            verdict = [problems]
            dist.broadcast_object_list(verdict, src=0)
            problems = verdict[0]
            if not problems:
                break
        return problems

    def _materialize(self, step: int, meta_bytes: bytes, download_all: bool) -> None:
        """The local copy of committed ``step`` holds the store's meta.json and files: kept if its meta.json
        is identical (and ``download_all`` is False), else each of the ranks sharing local_dir downloads its
        share of what is missing or differs. Collective (barriers on every path, whatever each node finds)."""
        path = self.local_step_dir(step)
        meta_path = os.path.join(path, META_FILE)
        where = self.remote.file_url(step, META_FILE)
        keep = not download_all and os.path.isfile(meta_path) and open(meta_path, "rb").read() == meta_bytes
        dist.barrier()  # every rank of the node has looked before any changes it
        failure = None
        try:
            meta = parse_meta(meta_bytes, where)
            files = meta.get("files") if isinstance(meta.get("files"), dict) else {}
            for rel in files:
                check_file_name(rel, where)
        except CheckpointError as e:
            failure, files, keep = e, {}, True
        if not keep and self.local_rank == 0:
            if download_all:
                _remove_local(path)
            elif os.path.exists(meta_path):
                os.unlink(meta_path)  # the copy is no checkpoint until its files are the store's
            os.makedirs(path, exist_ok=True)
            for name in set(os.listdir(path)) - set(files):  # files of another save of this step
                with contextlib.suppress(FileNotFoundError):  # another node's local rank 0 (a shared local_dir)
                    os.unlink(os.path.join(path, name))
        dist.barrier()
        if not keep:
            if self.local_rank == 0 and not download_all:
                log.info("downloading checkpoint %s to %s", self.remote.step_url(step), path)
            for rel in sorted(files)[self.local_rank::self.local_world_size]:
                if download_all or not local_file_ok(os.path.join(path, rel), files[rel]):
                    self.remote.download(step, rel, path)
        dist.barrier()
        if not keep and self.local_rank == 0:
            atomic_write(meta_path, meta_bytes)
        dist.barrier()
        if failure is not None:
            raise failure

    def load(self, path: str, states: dict[str, Stateful], meta: dict) -> None:
        """Load ``states`` in place (DCP reshards when the world size changed; each Stateful's
        ``load_state_dict`` runs) through the restricted readers, and refuse the checkpoint if its
        data position differs from ``meta``'s or it lacks one of the states."""
        md = read_dcp_metadata(path)
        _missing_states(path, md, states)
        state = {**states, DCP_KEY: _position_buffer(path, md)}
        load_state(state, path)
        compare_data_position(meta, state[DCP_KEY].numpy().tobytes(), os.path.join(path, META_FILE))
        self.last_step = meta["step"]
        self.cadence.start(self.last_step)
