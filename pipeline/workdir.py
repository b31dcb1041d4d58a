"""The run dir: every path under ``<work_dir>/<run key>/`` is built here, nowhere else.

The key hashes the job's content and its input files, so a changed job or input never reuses
stale work. Layout (``part-00007`` is partition 7, ``part_name``)::

    docs/part-00007.parquet          the partition's documents (extract; later stages never rewrite it)
    keys/part-00007.parquet          its exact-dedup keys
    ids/part-00007.parquet           its ids and their provenance (jobs with an id_field)
    quarantine/part-00007.parquet    its unreadable records
    removed/<stage>/<name>.parquet   what a stage removed (REMOVED_SCHEMA); <name> is the partition's
                                     (``val-part-00007`` for decontamination's validation pass)
    overrides/<stage>/<name>.parquet texts a stage shortened or redacted (OVERRIDE_SCHEMA)
    <stage>/<kind>/<name>.<ext>      a stage's own bookkeeping (``scratch``: fuzzy dedup's bands, ...)
    tokens/part-00007.parquet        the partition's token ids
    tokenizer.json, staging/, pack_index/, report.json, quarantine.jsonl, removed.jsonl
    _done/<step>/<task>.json         a task's completion marker: written last, holds its stats
    _done/<step>/<task>.batch.json   the marker of a batch of tasks run together (RayRunner), named
                                     by its first task: {"tasks": {name: stats}}, one commit for all
    logs/<step>/<task>.log           a task's warnings and errors; <task>.attempt-N: its batch's attempts

A task is finished iff its marker (or its batch's) exists. A crash (even ``kill -9``) leaves at
most temp files and outputs without a marker; a rerun rewrites those, and the output is the same
bytes because every task is deterministic.

The root may be any fsspec URL (``s3://bucket/work/<key>``), opened with the job's storage options
into one ``manifests.storage.Store`` that every read and write of the run dir goes through: nothing
here renames. Every file is written whole or not at all (a local temp file and ``os.replace``, or one
upload on an object store) and the marker, written last, is the commit.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import posixpath

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gristmill.manifests.hashing import canonical_json
from gristmill.manifests.parquet_part import ParquetPart  # noqa: F401  (the stages' output writer)
from gristmill.manifests.storage import Store


BATCH_SUFFIX = ".batch.json"  # _done/<step>/<first task>.batch.json: a batch's marker, {"tasks": {name: stats}}


def _parse_marker(data: bytes) -> dict | None:
    """A marker's stats, or None for one that is not a whole JSON object (torn)."""
    try:
        stats = json.loads(data)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError
        return None
    return stats if isinstance(stats, dict) else None


def part_name(part: int) -> str:
    return f"part-{part:05d}"


# op -> (whether a row group whose column spans [lo, hi] may hold a row with ``col op value``, the row test)
_OPS = {"=": (lambda lo, hi, v: lo <= v <= hi, pc.equal), "==": (lambda lo, hi, v: lo <= v <= hi, pc.equal),
        "<": (lambda lo, hi, v: lo < v, pc.less), "<=": (lambda lo, hi, v: lo <= v, pc.less_equal),
        ">": (lambda lo, hi, v: hi > v, pc.greater), ">=": (lambda lo, hi, v: hi >= v, pc.greater_equal),
        "in": (lambda lo, hi, v: any(lo <= x <= hi for x in v),
               lambda col, v: pc.is_in(col, value_set=pa.array(list(v), col.type)))}


def read_parquet(path: str, columns: list[str] | None = None, filters: list[tuple] | None = None,
                 schema: pa.Schema | None = None, store: Store | None = None) -> pa.Table:
    """``pq.read_table(path, columns=, filters=, schema=)`` for one work-dir file of ``store`` (None:
    the store of ``path`` with no storage options), through ``ParquetFile``. The files of a step are small and read thousands of times
    (each partition's task reads one per earlier stage; a part filter on every bucket-range file),
    and ``pq.read_table`` builds a dataset for each (discovery, a scanner, an Acero plan, thread
    pools): ~0.4-1.3 ms a small file against ~0.05-0.2 ms here (profiled at 300 partitions, its
    reads were 37% of all task time). ``filters`` are AND-ed ``(column, op, value)`` (``= == < <= >
    >= in``): row groups whose statistics exclude one are skipped, as the scanner does, and the rows
    of the rest tested with a mask (nulls never match, as in ``read_table``). Opened
    without pre-buffering (one small file, read once)."""
    store = store or Store.from_url(path)
    if not store.is_local:  # one read of the whole object
        return _read_parquet(pq.ParquetFile(pa.BufferReader(store.read(path))), columns, filters, schema)
    with open_parquet(path, store, pre_buffer=False) as pf:
        return _read_parquet(pf, columns, filters, schema)


@contextlib.contextmanager
def open_parquet(path: str, store: Store | None = None, **options):
    """``pq.ParquetFile`` of a work-dir file of ``store`` (None: the store of ``path``), closed on exit:
    a local file opened as an ``OSFile`` (given a path string, pyarrow resolves a filesystem for each
    open: ~90 us, on every one of a step's thousands of small files), another through the store."""
    store = store or Store.from_url(path)
    with pa.OSFile(store.path(path)) if store.is_local else store.open(path) as f:
        yield pq.ParquetFile(f, **options)


def iter_batches(path: str, columns: list[str] | None = None, batch_size: int = 65_536, store: Store | None = None):
    """``pq.ParquetFile(path).iter_batches(...)`` through ``open_parquet`` (the file closed when done)."""
    with open_parquet(path, store) as pf:
        yield from pf.iter_batches(columns=columns, batch_size=batch_size)


def _read_parquet(pf: pq.ParquetFile, columns, filters, schema) -> pa.Table:
    want = columns if columns is not None else (schema.names if schema is not None else None)
    if not filters:
        t = pf.read(columns=want, use_threads=False)
    else:
        for col, op, value in filters:
            if op not in _OPS:
                raise ValueError(f"read_parquet: unsupported filter {(col, op, value)!r}")
        names, meta = pf.schema_arrow.names, pf.metadata
        groups = [g for g in range(meta.num_row_groups) if _may_match(meta.row_group(g), names, filters)]
        need = None if want is None else list(dict.fromkeys([*want, *(c for c, _, _ in filters)]))
        t = pf.read_row_groups(groups, columns=need, use_threads=False)
        if t.num_rows:
            mask = functools.reduce(pc.and_kleene, [_OPS[op][1](t.column(col), value) for col, op, value in filters])
            t = t.filter(mask)
        if want is not None:
            t = t.select(want)
    if schema is not None:
        t = t.cast(pa.schema([schema.field(n) for n in t.column_names]))
    return t


def _may_match(rg, names: list[str], filters: list[tuple]) -> bool:
    for col, op, value in filters:
        stats = rg.column(names.index(col)).statistics if col in names else None
        if stats is not None and stats.has_min_max and not _OPS[op][0](stats.min, stats.max, value):
            return False
    return True


class WorkDir:
    """One run's directory. Small and picklable: tasks receive it and build their paths with it."""

    def __init__(self, root: str, storage_options: dict | None = None):
        self.storage_options = dict(storage_options or {})
        self.store = Store.from_url(root, **self.storage_options)  # pickled with it: a task opens its own
        self.root = root if self.store.is_local else root.rstrip("/")
        if self.store.is_local:
            self.store.makedirs(root)

    @classmethod
    def of_run(cls, work_dir: str, run_key: str, storage_options: dict | None = None) -> "WorkDir":
        """The run dir of the job whose key is ``run_key`` under the job's ``work_dir``."""
        return cls(os.path.join(work_dir, run_key), storage_options)

    def __repr__(self) -> str:
        return f"WorkDir({self.root!r})"

    @property
    def local(self) -> bool:
        """Whether the run dir is on this machine's disk (it has folders to make)."""
        return self.store.is_local

    def _path(self, *parts: str) -> str:
        return self.store.join(self.root, *parts)

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

    def part(self, path: str, schema: pa.Schema, **options) -> ParquetPart:
        """A ``ParquetPart`` writing ``path`` of this run dir (``row_group_size``, ``compression``)."""
        return ParquetPart(path, schema, store=self.store, **options)

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

    # -- per-partition files ------------------------------------------------------------------
    def docs(self, part: int) -> str:
        return self._path("docs", f"{part_name(part)}.parquet")

    def keys(self, part: int) -> str:
        return self._path("keys", f"{part_name(part)}.parquet")

    def ids(self, part: int) -> str:
        """Its ids with their provenance (jobs with an ``id_field``: the unique_ids step's input)."""
        return self._path("ids", f"{part_name(part)}.parquet")

    def quarantine(self, part: int) -> str:
        return self._path("quarantine", f"{part_name(part)}.parquet")

    def tokens(self, part: int) -> str:
        return self._path("tokens", f"{part_name(part)}.parquet")

    def removed(self, stage: str, part: int, prefix: str = "") -> str:
        return self._path("removed", stage, f"{prefix}{part_name(part)}.parquet")

    def overrides(self, stage: str, part: int, prefix: str = "") -> str:
        return self._path("overrides", stage, f"{prefix}{part_name(part)}.parquet")

    def scratch(self, stage: str, kind: str, name: str, ext: str = "parquet") -> str:
        """A stage's own bookkeeping file: ``<stage>/<kind>/<name>.<ext>`` (``kind`` "" for none)."""
        return self._path(stage, *([kind] if kind else []), f"{name}.{ext}")

    # -- reading a run back (inspect, the data card): the same layout, local or on an object store
    def is_run(self) -> bool:
        """Whether this is a run dir: extract wrote its first partition's documents."""
        return self.exists(self.docs(0))

    def folder_files(self, *folder: str, suffix: str = ".parquet") -> list[str]:
        """The paths of the files of one folder of this run dir ending in ``suffix``, sorted; [] if none."""
        path = self._path(*folder)
        try:
            names = self.listdir(path)
        except FileNotFoundError:
            return []
        return sorted(self._path(*folder, n) for n in names if n.endswith(suffix))

    def docs_files(self) -> list[str]:
        return [f for f in self.folder_files("docs") if posixpath.basename(f).startswith("part-")]

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
        path = self.report_json if self.exists(self.report_json) else self.docs(0)
        return self.store.modified(path)

    @classmethod
    def runs_at(cls, path: str, storage_options: dict | None = None) -> list["WorkDir"]:
        """The run dirs at ``path``, oldest first: itself when it is one, else those of the work
        dir it names (a directory or fsspec URL); nothing is created."""
        store = Store.from_url(path, **(storage_options or {}))
        if store.is_local and not store.isdir(path):
            return []
        here = cls(path, storage_options)
        if here.is_run():
            return [here]
        try:
            names = here.listdir(here.root)
        except FileNotFoundError:
            return []
        paths = [here._path(n) for n in names]
        runs = [run for p in paths if (not here.local or store.isdir(p)) and (run := cls(p, storage_options)).is_run()]
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
