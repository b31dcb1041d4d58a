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

from .meta import (DCP_KEY, META_FILE, STEP_DIR, CheckpointError, compare_data_position, encode_data_position, read_meta,
                   write_meta)

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
    return md


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


def read_data_position(path: str) -> bytes:
    """The data position stored in the checkpoint's DCP state (see trainer/meta.py). Local: no collectives."""
    state = {DCP_KEY: _position_buffer(path, read_dcp_metadata(path))}
    load_state(state, path, no_dist=True)
    return state[DCP_KEY].numpy().tobytes()


def check_data_position(path: str, meta: dict) -> None:
    """Refuse a checkpoint whose meta.json and DCP state disagree on what data the model saw."""
    compare_data_position(meta, read_data_position(path), os.path.join(path, META_FILE))


def verify(path: str, actual: dict[str, dict] | None = None) -> list[str]:
    """Problems with a committed checkpoint (empty when it can be trusted): meta.json intact and
    consistent, every file matching its recorded sha256, and (once the files match) the DCP
    metadata safe to read and its data position equal to meta.json's.
    ``actual`` is the directory's ``file_checksums`` when the caller already computed them."""
    try:
        meta = read_meta(path)
    except CheckpointError as e:
        return [str(e)]
    recorded = meta.get("files", {})
    actual = file_checksums(path) if actual is None else actual
    problems = []
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
            check_data_position(path, meta)
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
    """Saves, prunes and restores the checkpoints of one run. Collective: every rank calls it."""

    def __init__(self, run_dir: str, *, keep: int, async_save: bool, rank: int, world_size: int,
                 device: torch.device, before_commit: Callable[[int, str], None] | None = None):
        """``before_commit(step, tmp_dir)``, when given, runs on rank 0 after meta.json is written and
        before the rename that commits the save (tests use it to crash at exactly that point)."""
        self.run_dir, self.keep, self.async_save = run_dir, keep, async_save
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

    def save(self, step: int, states: dict[str, Stateful], meta: dict) -> float:
        """Write step ``step`` of ``states`` (trainer.state: model, optimizer, scheduler, loader,
        train state; DCP reshards them on load); synchronous saves are committed before this
        returns. Returns the seconds training was blocked (the whole save, or only the staging
        copy when async)."""
        started = time.perf_counter()
        self.wait()  # one save in flight at a time
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
        saved = {fqn.split(".", 1)[0] for fqn in md.state_dict_metadata}
        missing = sorted(set(states) - saved)
        if missing:
            raise CheckpointError(f"{path}: the DCP state has no {', '.join(missing)} entries (written by an older "
                                  f"trainer?); start a new run directory or resume with the trainer that wrote it")
        state = {**states, DCP_KEY: _position_buffer(path, md)}
        load_state(state, path)
        compare_data_position(meta, state[DCP_KEY].numpy().tobytes(), os.path.join(path, META_FILE))
