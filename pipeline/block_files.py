"""The block Parquet format of the run dir's per-partition files (pipeline/workdir.py names them).

Partitions are grouped into **blocks** of consecutive partitions (``block_parts``: up to 16, about 16
blocks below 256 partitions; a function of the partition count alone). A block's task writes ONE file
per kind of output (``BlockOutputs``) holding each of its partitions' rows in turn (``PartWriter``),
each partition's rows starting their own row groups, with the row range of each partition in the
file's Parquet metadata (``gristmill.parts``, ``PARTS_KEY``). A partition's rows are addressed by
``PartPath`` (the block file's path and the partition), which ``read_parquet`` and ``iter_batches``
read as that partition's rows only and ``writer`` writes as them. Every file is written whole or not
at all (``manifests.parquet_part.ParquetPart``), through a ``manifests.storage.Store``.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gristmill.errors import GristmillError
from gristmill.manifests.hashing import canonical_json
from gristmill.manifests.parquet_part import ParquetPart
from gristmill.manifests.storage import Store

BLOCK_PARTS = 16  # at most this many consecutive partitions share a block (its files and its task)
PARTS_KEY = b"gristmill.parts"  # a block file's index: {"<part>": [first row, rows]}, in its Parquet metadata

FRESH_HINT = "rerun the prepare with --fresh (it starts this run over), or delete its run dir"


class DamagedRunDir(GristmillError):
    """A finished step's file in a run dir that cannot be read back (edited, cut, bit-flipped): the
    run cannot resume from it; the message names the file and the way out (``FRESH_HINT``)."""


@contextlib.contextmanager
def damage_named(path: str):
    """pyarrow's words for a work-dir file it cannot decode, as one ``DamagedRunDir`` line with the
    way out. The machine's errors (an errno: a full disk, a missing file) keep their own message."""
    try:
        yield
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise
        raise DamagedRunDir(f"{path} is damaged ({type(e).__name__}: {' '.join(str(e).split())}); {FRESH_HINT}") from e


def block_parts(partitions: int) -> int:
    """How many consecutive partitions a block holds in a run of ``partitions``: as many as keep
    about 16 blocks (each a task that can run beside the others) up to ``BLOCK_PARTS``. A function
    of the partition count alone, never of the workers: the files never depend on how a run was
    scheduled."""
    return max(1, min(BLOCK_PARTS, partitions // 16))


class PartPath(str):
    """Partition ``part``'s rows of one kind: the path of its block's file (a plain ``str``, so it
    names the file), which ``read_parquet`` and ``iter_batches`` read as that partition's rows only
    and ``output`` writes as them."""

    part: int

    def __new__(cls, path: str, part: int):
        self = super().__new__(cls, path)
        self.part = part
        return self

    def __reduce__(self):
        return PartPath, (str(self), self.part)


_BLOCK: contextvars.ContextVar["BlockOutputs | None"] = contextvars.ContextVar("gristmill_block", default=None)


class BlockOutputs:
    """The files a block's task writes: one per kind (``docs/block-00003.parquet``, ...), holding
    the rows of each of its partitions in turn, with the index of their row ranges in the file's
    metadata. Open it around the block's items (``with BlockOutputs():``); ``output(PartPath)``
    inside writes into it. Committed (each file whole, ``ParquetPart``) when the block ends without
    an error, before the task's marker; on an error nothing is committed (the block is redone whole).
    The earlier steps' block files its partitions read are opened once for the block (``opened``,
    the last ``READERS`` of them), not once a partition."""

    READERS = 64  # block files kept open by a block's task (fuzzy dedup's verify reads other blocks' too)

    def __init__(self):
        self.files: dict[str, _BlockFile] = {}
        self._opened: dict[str, tuple[contextlib.ExitStack, pq.ParquetFile]] = {}

    def opened(self, path: str, store: Store) -> pq.ParquetFile:
        """A committed work-dir file, opened for the rest of the block (an earlier step's block
        file: no step reads its own outputs, so it cannot change while the block runs)."""
        if path in self._opened:
            self._opened[path] = self._opened.pop(path)  # the most recent last
        else:
            if len(self._opened) >= self.READERS:
                self._opened.pop(next(iter(self._opened)))[0].close()
            stack = contextlib.ExitStack()
            with damage_named(path):  # its reads are checked where they happen (read_parquet, iter_batches)
                self._opened[path] = (stack, stack.enter_context(open_parquet(path, store, pre_buffer=False)))
        return self._opened[path][1]

    def file(self, path: str, schema: pa.Schema, store: Store, **options) -> "_BlockFile":
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = _BlockFile(path, schema, store, **options)
        elif not f.schema.equals(schema):
            raise ValueError(f"{path}: written with two schemas in one block")
        return f

    def __enter__(self) -> "BlockOutputs":
        if _BLOCK.get() is not None:
            raise RuntimeError("a block's outputs opened inside another block's")
        self._token = _BLOCK.set(self)
        return self

    def __exit__(self, kind, exc, tb) -> None:
        _BLOCK.reset(self._token)
        for stack, _ in self._opened.values():
            stack.close()
        for f in self.files.values():
            if kind is None:
                f.commit()
            else:
                f.part.abort()


class _BlockFile:
    def __init__(self, path: str, schema: pa.Schema, store: Store, **options):
        self.path, self.schema, self.store, self.options = path, schema, store, options
        self.part = ParquetPart(path, schema, store=store, **options)
        self.index: dict[str, list[int]] = {}

    def commit(self) -> None:
        index = canonical_json(self.index)
        if self.part.rows == 0:  # no rows: an empty file whose schema carries the index
            ParquetPart(self.path, self.schema.with_metadata({PARTS_KEY: index}), store=self.store, **self.options).commit()
            return
        self.part.writer.add_key_value_metadata({PARTS_KEY: index})
        self.part.commit()


class PartWriter:
    """One partition's rows of one kind, written into its block's file (``WorkDir.part``): ``append``,
    ``write``, ``commit`` as ``ParquetPart``; its rows are a range of the file, named in its index."""

    def __init__(self, path: PartPath, schema: pa.Schema, store: Store, **options):
        block = _BLOCK.get()
        if block is None:
            raise RuntimeError(f"{path}: partition {path.part}'s output written outside its block's task")
        self.file, self.key = block.file(str(path), schema, store, **options), str(path.part)
        if self.key in self.file.index:
            raise RuntimeError(f"{path}: partition {path.part} written twice in one block")
        self.schema, self.start, self.rows = schema, self.file.part.rows, 0
        self._pending: list[dict] = []

    def append(self, row: dict) -> None:
        self._pending.append(row)
        if len(self._pending) >= 4096:
            self._flush()

    def write(self, rows: dict | pa.Table) -> None:
        self._flush()
        table = rows if isinstance(rows, pa.Table) else pa.table(rows, schema=self.schema)
        if table.num_rows:  # each write starts its own row groups: the partition's rows stay apart
            self.file.part.write(table)
            self.rows += table.num_rows

    def _flush(self) -> None:
        if self._pending:
            rows, self._pending = self._pending, []
            self.write(pa.Table.from_pylist(rows, schema=self.schema))

    def commit(self) -> None:
        self._flush()
        if self.file.part.rows != self.start + self.rows:
            raise RuntimeError(f"{self.file.path}: partitions {self.key} and another written at once")
        self.file.index[self.key] = [self.start, self.rows]

    def abort(self) -> None:
        """Nothing to undo here: the block's files are committed with the block or not at all."""




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
    without pre-buffering (one small file, read once). A ``PartPath``: that partition's rows of its
    block file."""
    store = store or Store.from_url(path)
    part = path.part if isinstance(path, PartPath) else None
    if part is not None and (block := _BLOCK.get()) is not None:  # inside a block's task: opened once for it
        pf = block.opened(str(path), store)
        with damage_named(str(path)):
            return _read_parquet(pf, columns, filters, schema, part)
    if not store.is_local:  # one read of the whole object
        data = store.read(path)
        with damage_named(str(path)):
            return _read_parquet(pq.ParquetFile(pa.BufferReader(data)), columns, filters, schema, part)
    with open_parquet(path, store, pre_buffer=False) as pf:
        return _read_parquet(pf, columns, filters, schema, part)


@contextlib.contextmanager
def open_parquet(path: str, store: Store | None = None, **options):
    """``pq.ParquetFile`` of a work-dir file of ``store`` (None: the store of ``path``), closed on exit:
    a local file opened as an ``OSFile`` (given a path string, pyarrow resolves a filesystem for each
    open: ~90 us, on every one of a step's thousands of small files), another through the store."""
    store = store or Store.from_url(path)
    with pa.OSFile(store.path(str(path))) if store.is_local else store.open(str(path)) as f:
        if not store.is_local:  # a remote read's own errors are the store's, not the file's
            yield pq.ParquetFile(f, **options)
            return
        with damage_named(str(path)):  # the footer, and every read of the file inside the block
            yield pq.ParquetFile(f, **options)


def iter_batches(path: str, columns: list[str] | None = None, batch_size: int = 65_536, store: Store | None = None):
    """``pq.ParquetFile(path).iter_batches(...)`` through ``open_parquet`` (the file closed when done);
    a ``PartPath``: that partition's rows."""
    if isinstance(path, PartPath) and (block := _BLOCK.get()) is not None:  # inside a block's task: opened once for it
        pf = block.opened(str(path), store or Store.from_url(path))
        with damage_named(str(path)):
            yield from _part_batches(pf, path.part, columns, batch_size)
        return
    with open_parquet(path, store) as pf:
        if isinstance(path, PartPath):
            yield from _part_batches(pf, path.part, columns, batch_size)
        else:
            yield from pf.iter_batches(columns=columns, batch_size=batch_size)


def _part_batches(pf: pq.ParquetFile, part: int, columns: list[str] | None, batch_size: int):
    groups = part_row_groups(pf, part)
    if groups:
        yield from pf.iter_batches(columns=columns, batch_size=batch_size, row_groups=groups)


def part_row_groups(pf: pq.ParquetFile, part: int) -> list[int]:
    """The row groups of a block file that hold partition ``part``'s rows (each partition's rows
    start their own row groups: ``PartWriter``). A partition the file's index does not name was not
    written there: an error, never read as empty."""
    meta = pf.metadata
    index = json.loads((meta.metadata or {}).get(PARTS_KEY, b"{}"))
    if str(part) not in index:
        raise ValueError(f"partition {part} is not in the block file (it holds {sorted(map(int, index))})")
    start, rows = index[str(part)]
    groups, at = [], 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if start <= at and at + n <= start + rows and n:
            groups.append(g)
        at += n
    return groups


def _read_parquet(pf: pq.ParquetFile, columns, filters, schema, part: int | None = None) -> pa.Table:
    want = columns if columns is not None else (schema.names if schema is not None else None)
    groups = None if part is None else part_row_groups(pf, part)
    if not filters:
        t = pf.read(columns=want, use_threads=False) if groups is None else \
            pf.read_row_groups(groups, columns=want, use_threads=False)
    else:
        for col, op, value in filters:
            if op not in _OPS:
                raise ValueError(f"read_parquet: unsupported filter {(col, op, value)!r}")
        names, meta = pf.schema_arrow.names, pf.metadata
        groups = [g for g in (range(meta.num_row_groups) if groups is None else groups)
                  if _may_match(meta.row_group(g), names, filters)]
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


def writer(path: str, schema: pa.Schema, store: Store, **options) -> "ParquetPart | PartWriter":
    """The writer of a work-dir file of ``store`` (``row_group_size``, ``compression``): a
    ``ParquetPart``, or for a ``PartPath`` a partition's rows of its block file (``PartWriter``,
    inside its block's task)."""
    if isinstance(path, PartPath):
        return PartWriter(path, schema, store, **options)
    return ParquetPart(path, schema, store=store, **options)
