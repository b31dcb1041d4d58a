"""The run dir: every path under ``<work_dir>/<run key>/`` is built here, nowhere else.

The key hashes the job's content, its input files and the layout version, so a changed job or
input never reuses stale work. Partitions are grouped into **blocks** of consecutive partitions
(``block_parts``: up to 16, about 16 blocks below 256 partitions; a function of the partition count
alone, fixed in ``layout.json``): every per-partition step runs a task per block, and the block
writes ONE file per kind of output holding each of its partitions' rows in turn; the format of those
files (``PartPath``, ``PartWriter``, ``read_parquet``, ``iter_batches``) is pipeline/block_files.py's,
and its names are importable from here too. Layout (``block-00003`` is block 3: partitions 3B .. 4B - 1)::

    layout.json                       {"block_parts": B}
    docs/block-00003.parquet          its partitions' documents (extract; later stages never rewrite them)
    keys/block-00003.parquet          their exact-dedup keys
    ids/block-00003.parquet           their ids and provenance (jobs with an id_field)
    quarantine/block-00003.parquet    their unreadable records
    removed/<stage>/block-00003.parquet   what a stage removed (REMOVED_SCHEMA); ``val-block-00003``
                                      for decontamination's validation pass
    overrides/<stage>/block-00003.parquet texts a stage shortened or redacted (OVERRIDE_SCHEMA)
    <stage>/<kind>/block-00003.parquet    a stage's per-partition bookkeeping (``part_scratch``:
                                      fuzzy dedup's bands, members, edges, links; quality's metrics, ...)
    <stage>/<kind>/<name>.<ext>       a global step's bookkeeping (``scratch``: bucket ranges, ...)
    tokens/block-00003.parquet        their token ids
    tokenizer.json, staging/, pack_index/, report.json, quarantine.jsonl, removed.jsonl
    _done/<step>/<task>.json          a task's completion marker: written last, holds its stats
    _done/<step>/<task>.batch.json    the marker of a batch of tasks run together (a block, or a
                                      batch of a global step's tasks), named by its first task:
                                      {"tasks": {name: stats}}, one commit for all
    logs/<step>/<task>.log            a task's warnings and errors; <task>.attempt-N: its batch's attempts

So a partition leaves (kinds + 2 x steps) / B files, not kinds + 2 x steps (issue 32:
benchmarks/workdir_files.py counts them). A task is finished iff its marker (or its batch's)
exists, and a block's partitions are finished together: a crash (even ``kill -9``) leaves at most
temp files and outputs without a marker; a rerun rewrites the whole block, and the output is the
same bytes because every task is deterministic.

The root may be any fsspec URL (``s3://bucket/work/<key>``), opened with the job's storage options
into one ``manifests.storage.Store`` that every read and write of the run dir goes through: nothing
here renames. Every file is written whole or not at all (a local temp file and ``os.replace``, or one
upload on an object store) and the marker, written last, is the commit.
"""
from __future__ import annotations

import functools
import json
import os
import posixpath

import pyarrow as pa

from gristmill.manifests.hashing import canonical_json
from gristmill.manifests.parquet_part import ParquetPart  # noqa: F401  (the stages' output writer)
from gristmill.manifests.storage import Store

# the block format (block_files.py), importable from here as before: the stages name it with the layout
from .block_files import (BLOCK_PARTS, FRESH_HINT, PARTS_KEY, BlockOutputs, DamagedRunDir, PartPath,  # noqa: F401
                          PartWriter, block_parts, damage_named,
                          iter_batches, open_parquet, part_row_groups, read_parquet, writer)


BATCH_SUFFIX = ".batch.json"  # _done/<step>/<first task>.batch.json: a batch's marker, {"tasks": {name: stats}}
_OLDER_DOCS = ("docs", "part-00000.parquet")  # the first documents file of a run dir before the block layout


def _parse_marker(data: bytes) -> dict | None:
    """A marker's stats, or None for one that is not a whole JSON object (torn)."""
    try:
        stats = json.loads(data)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError
        return None
    return stats if isinstance(stats, dict) else None


def part_name(part: int) -> str:
    return f"part-{part:05d}"


class WorkDir:
    """One run's directory. Small and picklable: tasks receive it and build their paths with it."""

    def __init__(self, root: str, storage_options: dict | None = None, block_parts: int | None = None):
        self.storage_options = dict(storage_options or {})
        self.store = Store.from_url(root, **self.storage_options)  # pickled with it: a task opens its own
        self.root = root if self.store.is_local else root.rstrip("/")
        if self.store.is_local:
            self.store.makedirs(root)
        if block_parts is not None:
            self.__dict__["block_parts"] = block_parts

    def __getstate__(self) -> dict:  # a task gets the blocks with it, never reads layout.json
        return {**self.__dict__, "block_parts": self.block_parts}

    @classmethod
    def of_run(cls, work_dir: str, run_key: str, storage_options: dict | None = None) -> "WorkDir":
        """The run dir of the job whose key is ``run_key`` under the job's ``work_dir``."""
        return cls(os.path.join(work_dir, run_key), storage_options)

    def __repr__(self) -> str:
        return f"WorkDir({self.root!r})"

    def remove(self) -> None:
        """Delete this run dir and everything in it (``prepare --fresh``: a run started over)."""
        if self.store.exists(self.root):
            self.store.fs.rm(self.store.path(self.root), recursive=True)
        self.__dict__.pop("block_parts", None)
        if self.store.is_local:
            self.store.makedirs(self.root)

    @property
    def local(self) -> bool:
        """Whether the run dir is on this machine's disk (it has folders to make)."""
        return self.store.is_local

    def _path(self, *parts: str) -> str:
        return self.store.join(self.root, *parts)

    @functools.cached_property
    def block_parts(self) -> int:
        """Partitions per block in this run (``layout.json``, written by ``set_blocks`` when the run
        starts); 1 in a run dir without one (a block per partition)."""
        try:
            raw = self.read_bytes(self.layout_json)
        except FileNotFoundError:
            return 1
        try:
            n = json.loads(raw)["block_parts"]
        except (ValueError, KeyError, TypeError):
            n = None
        if type(n) is not int or n < 1:
            raise DamagedRunDir(f"{self.layout_json} holds {raw[:80]!r}, not this run's block layout "
                                f"({{\"block_parts\": N}}); {FRESH_HINT}")
        return n

    def set_blocks(self, partitions: int) -> None:
        """Fix this run's blocks for ``partitions`` partitions (``block_parts``) in ``layout.json``,
        once: a resumed run finds the blocks its finished tasks wrote."""
        want = block_parts(partitions)
        if not self.exists(self.layout_json):
            self.write(self.layout_json, canonical_json({"block_parts": want}))
        self.__dict__.pop("block_parts", None)
        if self.block_parts != want:
            raise DamagedRunDir(f"{self.layout_json} says {self.block_parts} partitions a block where this run makes "
                                f"{want} (edited?); the files of its finished steps cannot be found; {FRESH_HINT}")

    def block_of(self, part: int) -> int:
        return part // self.block_parts

    def _part(self, folder: tuple[str, ...], part: int, prefix: str = "") -> PartPath:
        """Partition ``part``'s rows of the kind in ``folder``: in its block's file there."""
        return PartPath(self._path(*folder, f"{prefix}block-{self.block_of(part):05d}.parquet"), part)

    def create_new(self, path: str, data: bytes = b"") -> bool:
        """Create a file holding ``data`` if nothing has the name: True if this call made it
        (create-if-absent; not fsynced: bookkeeping a crash may lose)."""
        return self.store.put_new(path, data, sync=False)

    def listdir(self, path: str) -> list[str]:
        """The names in a folder of this run dir (FileNotFoundError if there is none)."""
        return self.store.listdir(path)

    def exists(self, path: str) -> bool:
        return self.store.exists(path)

    def read_bytes(self, path: str) -> bytes:
        """A whole committed file of this run dir (FileNotFoundError if absent)."""
        return self.store.read(path)

    def part(self, path: str, schema: pa.Schema, **options) -> "ParquetPart | PartWriter":
        """The writer of ``path`` of this run dir (``row_group_size``, ``compression``): a
        ``ParquetPart``, or for a ``PartPath`` a partition's rows of its block file (``PartWriter``,
        inside its block's task)."""
        return writer(path, schema, self.store, **options)

    def read_parquet(self, path: str, columns: list[str] | None = None, filters: list[tuple] | None = None,
                     schema: pa.Schema | None = None) -> pa.Table:
        """``read_parquet`` of a file of this run dir."""
        return read_parquet(path, columns, filters, schema, self.store)

    def open_parquet(self, path: str, **options):
        """``open_parquet`` of a file of this run dir."""
        return open_parquet(path, self.store, **options)

    def iter_batches(self, path: str, columns: list[str] | None = None, batch_size: int = 65_536):
        """``iter_batches`` of a file of this run dir."""
        return iter_batches(path, columns, batch_size, self.store)

    def write(self, path: str, data) -> None:
        """Write a whole file of this run dir, replacing any older one (``Store.put``)."""
        self.store.put(path, data)

    # -- per-partition rows, in block files ----------------------------------------------------
    def docs(self, part: int) -> PartPath:
        return self._part(("docs",), part)

    def keys(self, part: int) -> PartPath:
        return self._part(("keys",), part)

    def ids(self, part: int) -> PartPath:
        """Its ids with their provenance (jobs with an ``id_field``: the unique_ids step's input)."""
        return self._part(("ids",), part)

    def quarantine(self, part: int) -> PartPath:
        return self._part(("quarantine",), part)

    def tokens(self, part: int) -> PartPath:
        return self._part(("tokens",), part)

    def removed(self, stage: str, part: int, prefix: str = "") -> PartPath:
        return self._part(("removed", stage), part, prefix)

    def overrides(self, stage: str, part: int, prefix: str = "") -> PartPath:
        return self._part(("overrides", stage), part, prefix)

    def part_scratch(self, stage: str, kind: str, part: int) -> PartPath:
        """A stage's own per-partition bookkeeping: ``<stage>/<kind>/block-N.parquet``."""
        return self._part((stage, *([kind] if kind else [])), part)

    def scratch(self, stage: str, kind: str, name: str, ext: str = "parquet") -> str:
        """A stage's own bookkeeping file: ``<stage>/<kind>/<name>.<ext>`` (``kind`` "" for none)."""
        return self._path(stage, *([kind] if kind else []), f"{name}.{ext}")

    @staticmethod
    def whole_files(paths: list[str]) -> list[str]:
        """The distinct files of ``paths`` in order, each as a whole file (a block file once, all its
        partitions' rows in partition order): what a step that reads every partition's rows opens."""
        return list(dict.fromkeys(str(p) for p in paths))

    def block_files(self, path_of, parts) -> list[str]:
        """``whole_files([path_of(p) for p in parts])`` without a path per partition: ``path_of`` is
        called for the first of ``parts`` in each block only. What the driver lists for every partition
        (at publish: a file per block and kind, not P x kinds paths)."""
        firsts: dict[int, int] = {}
        for p in parts:
            firsts.setdefault(self.block_of(p), p)
        return self.whole_files(path_of(p) for p in firsts.values())

    # -- reading a run back (inspect, the data card): the same layout, local or on an object store
    def is_run(self) -> bool:
        """Whether this is a run dir: extract wrote its first partition's documents."""
        return self.exists(self.docs(0))

    def is_older_run(self) -> bool:
        """Whether this is a run dir of a gristmill before the block layout (a file a partition,
        ``docs/part-00000.parquet``), which this one does not read."""
        return not self.is_run() and self.exists(self._path(*_OLDER_DOCS))

    def folder_files(self, *folder: str, suffix: str = ".parquet") -> list[str]:
        """The paths of the files of one folder of this run dir ending in ``suffix``, sorted; [] if none."""
        path = self._path(*folder)
        try:
            names = self.listdir(path)
        except FileNotFoundError:
            return []
        return sorted(self._path(*folder, n) for n in names if n.endswith(suffix))

    def docs_files(self) -> list[str]:
        return [f for f in self.folder_files("docs") if posixpath.basename(f).startswith("block-")]

    def parts(self) -> list[int]:
        """The partitions of this run, from its document files' indexes."""
        out = []
        for f in self.docs_files():
            with self.open_parquet(f) as pf:
                out += map(int, json.loads((pf.metadata.metadata or {}).get(PARTS_KEY, b"{}")))
        return sorted(out)


    def removal_stages(self) -> list[str]:
        """The stages that wrote removals in this run (folder names under ``removed/``), by name."""
        try:
            return sorted(self.listdir(self._path("removed")))
        except FileNotFoundError:
            return []

    def removed_files(self, stage: str) -> list[str]:
        return self.folder_files("removed", stage)

    def modified(self) -> float:
        """When this run last finished a step (its report, else its first partition), for ordering runs."""
        for path in (self.report_json, self.docs(0), self._path(*_OLDER_DOCS)):
            if self.exists(path):
                return self.store.modified(path)
        return 0.0

    @classmethod
    def runs_at(cls, path: str, storage_options: dict | None = None, *, older: bool = False) -> list["WorkDir"]:
        """The run dirs at ``path``, oldest first: itself when it is one, else those of the work
        dir it names (a directory or fsspec URL); nothing is created. ``older``: the run dirs of
        an earlier layout instead (``is_older_run``), to name them in an error."""
        is_run = cls.is_older_run if older else cls.is_run
        store = Store.from_url(path, **(storage_options or {}))
        if store.is_local and not store.isdir(path):
            return []
        here = cls(path, storage_options)
        if is_run(here):
            return [here]
        try:
            names = here.listdir(here.root)
        except FileNotFoundError:
            return []
        paths = [here._path(n) for n in names]
        runs = [run for p in paths if (not here.local or store.isdir(p)) and is_run(run := cls(p, storage_options))]
        return sorted(runs, key=lambda r: r.modified())

    # -- the run's single files ---------------------------------------------------------------
    @property
    def tokenizer_json(self) -> str:
        return self._path("tokenizer.json")

    @property
    def staging(self) -> str:
        return self._path("staging")

    def staged(self, rel: str) -> str:
        """A file of the dataset being built, by its path in the version (``shards/...``, ``doc_index.parquet``)."""
        return os.path.join(self.staging, rel)

    def pack_index(self, name: str) -> str:
        return self._path("pack_index", f"{name}.parquet")

    @property
    def report_json(self) -> str:
        return self._path("report.json")

    @property
    def layout_json(self) -> str:
        return self._path("layout.json")

    @property
    def accounting_json(self) -> str:
        return self._path("accounting.json")

    @property
    def quarantine_jsonl(self) -> str:
        return self._path("quarantine.jsonl")

    @property
    def removed_jsonl(self) -> str:
        return self._path("removed.jsonl")

    # -- task logs ----------------------------------------------------------------------------
    def logs(self, step: str) -> str:
        return self._path("logs", step)

    def log(self, step: str, name: str) -> str:
        """A task's warnings and errors (created on the first one)."""
        return self._path("logs", step, f"{name}.log")

    def attempt(self, step: str, name: str, n: int) -> str:
        """A file per attempt of a batch of tasks that starts with task ``name``: the host and pid
        of the worker that ran it (``record_attempt``)."""
        return self._path("logs", step, f"{name}.attempt-{n}")

    @staticmethod
    def attempt_of(filename: str) -> tuple[str, int] | None:
        """(first task, attempt number) of an attempt file's name, None for any other name in a
        step's logs: a task's log, or the temp file of an attempt a killed worker was creating
        (``<name>.attempt-1.tmp-…``: counted as an attempt, it read as a retry)."""
        first, sep, n = filename.rpartition(".attempt-")
        return (first, int(n)) if sep and first and n.isdigit() else None

    # -- task markers -------------------------------------------------------------------------
    def marker(self, step: str, name: str) -> str:
        return self._path("_done", step, f"{name}.json")

    def batch_marker(self, step: str, first: str) -> str:
        """The marker of a batch of tasks run together, named by its first task."""
        return self._path("_done", step, f"{first}{BATCH_SUFFIX}")

    def done(self, step: str, name: str) -> dict | None:
        """The stats of a finished task, or None if it has to be (re)done: its own marker, else
        the batch marker that lists it (read through ``finished``: for single lookups, not loops)."""
        try:
            return _parse_marker(self.read_bytes(self.marker(step, name)))
        except FileNotFoundError:
            return self.finished(step).get(name)

    def finished(self, step: str) -> dict[str, dict]:
        """Every finished task of the step, name -> its stats: one listing of ``_done/<step>/`` and a
        read of each marker there, a batch marker standing for all its tasks. A step of 48,000 tasks
        that starts fresh makes one call (no folder yet), not 48,000 failed opens; a resumed one reads
        one file per batch. A marker's temp file (``*.tmp-*``) is not listed, and a marker that does
        not parse (torn by a crash of the machine) counts as absent: its tasks are redone."""
        try:
            names = sorted(self.listdir(self._path("_done", step)))
        except FileNotFoundError:
            return {}
        out: dict[str, dict] = {}
        for n in names:
            if not n.endswith(".json"):
                continue
            try:
                stats = _parse_marker(self.read_bytes(self._path("_done", step, n)))
            except FileNotFoundError:
                continue
            if stats is None:
                continue
            if n.endswith(BATCH_SUFFIX):
                tasks = stats.get("tasks")
                if isinstance(tasks, dict):
                    out.update(tasks)
            else:
                out[n[:-len(".json")]] = stats
        return out

    def mark_batch_done(self, step: str, stats: dict[str, dict]) -> None:
        """Commit a batch of tasks (name -> stats, in item order) with one marker, written whole
        (temp file, fsync, rename; one upload on an object store) after all their outputs: the
        fsync also commits the outputs with the filesystem's journal (ext4's ordered mode)."""
        self.store.put(self.batch_marker(step, next(iter(stats))), canonical_json({"tasks": stats}))

    def mark_done(self, step: str, name: str, stats: dict, *, sync: bool = True) -> None:
        """Commit a task: its marker, written under a unique name and renamed. ``sync`` fsyncs it,
        which also commits the task's outputs with the filesystem's journal (ext4's ordered mode);
        a batch of tasks syncs its last marker only (pipeline.runner.run_batch)."""
        self.store.put(self.marker(step, name), canonical_json(stats), sync=sync)
