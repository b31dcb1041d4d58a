"""Checkpoints: DCP shards plus a ``meta.json`` that ties the weights to the exact data they saw.

Layout (docs/trainer.md has every field)::

    <run_dir>/checkpoints/step-<N>/       committed: N optimizer steps done
        .metadata, __<rank>_0.distcp      torch.distributed.checkpoint files (model, optimizer, scheduler, loader, train state: trainer/state.py)
        meta.json                         step, data manifest, loader state, RNG, config, sha256 of files
    <run_dir>/checkpoints/.tmp-step-<N>/  being written; never read

A save writes everything under the temporary name; rank 0 hashes the files and writes meta.json
only after a barrier proves every rank finished, then renames the directory. A crash at any point
before the rename leaves only a ``.tmp-`` directory, which resume ignores and the next start
deletes. Resume walks committed checkpoints newest first and takes the first that verifies: meta.json
intact (trainer/meta.py), every file matching its sha256, and the data position stored in the
DCP state equal to meta.json's.

DCP's ``.metadata`` is a pickle, and the non-tensor entries of the state (optimizer
hyper-parameters) are ``torch.save`` blobs: a checkpoint is untrusted input, so both are read
only through restricted unpicklers (:class:`SafeReader`, :class:`SafeLoadPlanner`), never
through ``pickle.load`` or ``torch.load(weights_only=False)``.
"""
from __future__ import annotations

import base64
import collections
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
import time
import warnings
import zipfile
from collections.abc import Callable
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

from .errors import CheckpointError
from .meta import DCP_KEY, META_FILE, STEP_DIR, compare_data_position, encode_data_position, read_meta, write_meta

log = logging.getLogger("gristmill.trainer")

TMP_PREFIX = ".tmp-"


# -- paths ----------------------------------------------------------------------------------
def checkpoints_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def step_dir(run_dir: str, step: int) -> str:
    return os.path.join(checkpoints_dir(run_dir), f"step-{step}")


def committed(run_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every committed checkpoint, oldest first."""
    root = checkpoints_dir(run_dir)
    if not os.path.isdir(root):
        return []
    found = [(int(m.group(1)), os.path.join(root, name)) for name in os.listdir(root) if (m := STEP_DIR.match(name))]
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
def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _position_tensor(data: bytes) -> torch.Tensor:
    # A plain (replicated) tensor: DCP writes it once, and its bytes land in a file meta.json hashes.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@dataclass
class PendingSave:
    """An asynchronous save in flight: committed once every rank's write has finished."""

    step: int
    tmp: str
    meta: dict
    future: object
    started: float


class Checkpointer:
    """Saves, prunes and restores the checkpoints of one run, and says when a save is due. Collective:
    every rank calls it."""

    def __init__(self, run_dir: str, *, keep: int, async_save: bool, rank: int, world_size: int,
                 device: torch.device, before_commit: Callable[[int, str], None] | None = None,
                 enabled: bool = True, every: int = 0):
        """``before_commit(step, tmp_dir)``, when given, runs on rank 0 after meta.json is written and
        before the rename that commits the save (tests use it to crash at exactly that point).
        ``every``: steps between saves (0: only at the end); ``enabled`` False: never due."""
        self.run_dir, self.keep, self.async_save = run_dir, keep, async_save
        self.enabled, self.every = enabled, every
        self.last_step = 0  # the step of the newest save or loaded checkpoint (0: the initial weights)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.before_commit = before_commit
        self.pending: PendingSave | None = None
        # Async writes run collectives from a background thread: give them their own gloo group so
        # they never interleave with the training step's collectives.
        self._async_group = dist.new_group(backend="gloo") if async_save else None
        if rank == 0:
            self._remove_stale_tmp()
        dist.barrier()

    def _remove_stale_tmp(self) -> None:
        root = checkpoints_dir(self.run_dir)
        if os.path.isdir(root):
            for name in os.listdir(root):
                if name.startswith(TMP_PREFIX):  # an interrupted save: never valid
                    log.info("removing interrupted checkpoint %s", name)
                    shutil.rmtree(os.path.join(root, name), ignore_errors=True)

    # -- cadence --------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """A save after optimizer step ``step`` is due: every ``every`` steps."""
        return self.enabled and self.every > 0 and step % self.every == 0

    def due_at_end(self, step: int) -> bool:
        """The end of the run (or of this slice of it) is always checkpointed, unless it already is
        (or no step was trained past the newest checkpoint)."""
        return self.enabled and step > self.last_step

    def save(self, step: int, states: dict[str, Stateful], meta: dict) -> float:
        """Write step ``step`` of ``states`` (trainer.state: model, optimizer, scheduler, loader,
        train state; DCP reshards them on load); synchronous saves are committed before this
        returns. Returns the seconds training was blocked (the whole save, or only the staging
        copy when async)."""
        started = time.perf_counter()
        self.wait()  # one save in flight at a time
        self.last_step = step
        tmp = os.path.join(checkpoints_dir(self.run_dir), f"{TMP_PREFIX}step-{step}")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        dist.barrier()
        rngs = [None] * self.world_size
        dist.all_gather_object(rngs, rng_state())
        meta = {**meta, "rng": rngs}
        state = {**states, DCP_KEY: _position_tensor(encode_data_position(meta))}
        if self.async_save:
            future = dcp.async_save(state, checkpoint_id=tmp, process_group=self._async_group)
            self.pending = PendingSave(step, tmp, meta, future, started)
            return time.perf_counter() - started
        dcp.save(state, checkpoint_id=tmp)
        dist.barrier()  # every rank's shards are on disk
        self._commit(step, tmp, meta, started)
        return time.perf_counter() - started

    def poll(self) -> None:
        """Commit a finished async save. Collective (one tiny all-reduce) while a save is pending."""
        if self.pending is None:
            return
        done = torch.tensor([int(self.pending.future.done())], device=self.device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)  # on the training group, not the one writing
        if done.item():
            self.wait()

    def wait(self) -> None:
        """Block until an async save in flight is written by every rank, then commit it."""
        if self.pending is None:
            return
        p, self.pending = self.pending, None
        p.future.result()
        dist.barrier()
        self._commit(p.step, p.tmp, p.meta, p.started)

    def _commit(self, step: int, tmp: str, meta: dict, started: float) -> None:
        final = step_dir(self.run_dir, step)
        files = collective_checksums(tmp, self.rank, self.world_size)
        if self.rank == 0:
            meta = {**meta, "files": files, "save_seconds": round(time.perf_counter() - started, 3),
                    "created_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()}
            write_meta(tmp, meta)
            _fsync_dir(tmp)
            if self.before_commit is not None:
                self.before_commit(step, tmp)
            if os.path.exists(final):  # a re-run of the same step (e.g. after a resume): replace it
                shutil.rmtree(final)
            os.rename(tmp, final)  # the commit: a directory named step-<N> is always complete
            _fsync_dir(os.path.dirname(final))
            self._prune()
        dist.barrier()

    def _prune(self) -> None:
        for _, path in committed(self.run_dir)[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    # -- restore --------------------------------------------------------------------------------
    def latest(self) -> tuple[str | None, dict | None]:
        """The newest checkpoint that verifies (all ranks share the hashing); rank 0 decides and
        every rank gets its path and meta."""
        path, passed_over = find_resumable(
            self.run_dir, lambda d: collective_checksums(d, self.rank, self.world_size))
        choice = [None, None]
        if self.rank == 0:
            for reason in passed_over:
                log.warning("not resuming from %s", reason)
            choice = [path, read_meta(path) if path else None]
        dist.broadcast_object_list(choice, src=0)
        return choice[0], choice[1]

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
