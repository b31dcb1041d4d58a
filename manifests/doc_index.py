"""The document index: a Parquet table mapping every token span back to its document.

One row per (document, shard row) span, sorted by (shard, row, start), so the audit can go
from "rows a model saw" to "documents it saw" with a join and no replay of training.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .errors import FactMismatchError, HashMismatchError, ManifestError
from .hashing import sha256_bytes, stable_fraction
from .manifest import Manifest
from .parquet_part import ParquetPart
from .storage import Store

DOC_INDEX_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.int32(), nullable=False),  # index into manifest.shards
        pa.field("row", pa.int64(), nullable=False),  # row inside that shard
        pa.field("start", pa.int32(), nullable=False),  # first token of the span inside the row
        pa.field("length", pa.int32(), nullable=False),  # tokens of the span (EOS counted with its document)
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # input URI the document came from
        pa.field("position", pa.int64(), nullable=False),  # record index or byte offset inside the source
        pa.field("lang", pa.string()),
        pa.field("url", pa.string()),  # the document's URL where its input had one (WARC-Target-URI, a url field); else null
    ]
)
# Indexes published before the ``url`` column: still read and verified as they are.
LEGACY_SCHEMAS = (pa.schema(list(DOC_INDEX_SCHEMA)[:-1]),)
OPTIONAL_COLUMNS = ("url",)


ROW_GROUP_ROWS = 1 << 16  # a fixed row-group size keeps the bytes (hence the hash) independent of batching


class DocIndexWriter:
    """Stream spans into the index file, in order, with memory bounded by one row group.

    Rows are written in groups of exactly ``ROW_GROUP_ROWS`` (the last one shorter) whatever
    the sizes of the tables handed to :meth:`write`, and with no wall-clock metadata, so equal
    spans give equal bytes. The file appears under its name only on :meth:`close`; a writer
    that fails or is abandoned leaves a temp file, never a valid-looking index.
    """

    def __init__(self, path: str, store: Store | None = None):
        self.part = ParquetPart(path, DOC_INDEX_SCHEMA, row_group_size=ROW_GROUP_ROWS, store=store)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def write(self, table: pa.Table) -> None:
        for name in OPTIONAL_COLUMNS:  # a writer without provenance URLs: the column is null
            if name not in table.column_names:
                table = table.append_column(name, pa.nulls(table.num_rows, DOC_INDEX_SCHEMA.field(name).type))
        try:
            table = table.select(DOC_INDEX_SCHEMA.names).cast(DOC_INDEX_SCHEMA)
        except (KeyError, pa.ArrowInvalid) as e:
            raise ManifestError(f"document index does not match the schema in docs/format.md: {e}") from e
        self.pending.append(table)
        self.pending_rows += table.num_rows
        if self.pending_rows >= ROW_GROUP_ROWS:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self.pending_rows:
            return
        table = pa.concat_tables(self.pending)
        whole = table.num_rows if final else table.num_rows - table.num_rows % ROW_GROUP_ROWS
        self.part.write(table.slice(0, whole))  # cut into row groups of exactly ROW_GROUP_ROWS
        rest = table.slice(whole)
        self.pending, self.pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    @property
    def rows(self) -> int:
        """Spans written so far (the row count the manifest states once closed)."""
        return self.part.rows

    def close(self) -> None:
        self._flush(final=True)
        self.part.commit()

    def abort(self) -> None:
        self.part.abort()

    def __enter__(self) -> "DocIndexWriter":
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.abort() if exc_type else self.close()


def write_doc_index(path: str, table: pa.Table) -> None:
    """Write a whole index at once, atomically and deterministically."""
    with DocIndexWriter(path) as w:
        w.write(table)


def read_doc_index(source, columns: list[str] | None = None, filters=None) -> pa.Table:
    """The index (or ``columns`` of it); an optional column a legacy index lacks reads as nulls."""
    import pyarrow.parquet as pq  # lazy: `gristmill serve` imports this module and never reads Parquet (its RSS at start, issue 41)

    names = pq.read_schema(source).names
    if hasattr(source, "seek"):
        source.seek(0)
    want = list(columns or DOC_INDEX_SCHEMA.names)
    absent = [c for c in want if c not in names and c in OPTIONAL_COLUMNS]
    missing = set(want) - set(names) - set(absent)
    if missing:
        raise ManifestError(f"document index lacks column(s) {sorted(missing)}")
    table = _read_filtered(source, [c for c in want if c not in absent], filters)
    for c in absent:
        table = table.append_column(c, pa.nulls(table.num_rows, DOC_INDEX_SCHEMA.field(c).type))
    return table.select(want)


def _read_filtered(source, columns: list[str], filters) -> pa.Table:
    """``columns`` of the rows matching every ``(column, op, value)`` of ``filters`` (op ``=``, ``==`` or
    ``in``), read through ``ParquetFile`` a row group at a time, skipping row groups whose statistics
    exclude the value. Not ``pq.read_table``: its dataset scanner leaves read-ahead tasks on Arrow's
    thread pools after it returns, and a process that exits then aborts now and then
    (``terminate called without an active exception``, apache/arrow#34314, #39862)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(source)
    if not filters:
        return pf.read(columns=columns, use_threads=False)
    names = pf.schema_arrow.names
    wanted = []
    for col, op, value in filters:
        if op not in ("=", "==", "in") or col not in names:
            raise ManifestError(f"document index: unsupported filter {(col, op, value)!r}")
        wanted.append((col, names.index(col), list(value) if op == "in" else [value]))
    read_cols = list(dict.fromkeys(columns + [c for c, _, _ in wanted]))
    parts = []
    for g in range(pf.num_row_groups):
        rg = pf.metadata.row_group(g)
        if not all(_may_hold(rg.column(i).statistics, values) for _, i, values in wanted):
            continue
        t = pf.read_row_group(g, columns=read_cols, use_threads=False)
        mask = None
        for col, _, values in wanted:
            m = pc.is_in(t.column(col), value_set=pa.array(values, t.schema.field(col).type))
            mask = m if mask is None else pc.and_(mask, m)
        parts.append(t.filter(mask).select(columns))
    if not parts:
        return pf.schema_arrow.empty_table().select(columns)
    return pa.concat_tables(parts)


def _may_hold(stats, values: list) -> bool:
    if stats is None or not stats.has_min_max:
        return True
    try:
        return any(stats.min <= v <= stats.max for v in values)
    except TypeError:  # a value of another type than the column's: it matches nothing, but let the mask say so
        return True


def row_offsets(manifest: Manifest) -> np.ndarray:
    """``offsets[s] + row`` is a row's key: unique across all shards of the manifest, and sorted
    the way the index is (by shard, then row)."""
    return np.concatenate([[0], np.cumsum([s.rows for s in manifest.shards], dtype=np.int64)])


def read_published_doc_index(published, columns: list[str] | None = None, filters=None,
                             storage_options: dict | None = None) -> pa.Table:
    """The document index a published manifest pins, read once and hash-checked (a join with the
    rows a model saw is only as good as the index). ``published``: a ``manifests.Published``."""
    from .store import join

    url = join(published.url, published.manifest.doc_index.path)
    if storage_options is None and published.store is not None:  # loaded with its storage options
        data = published.store.read(url)
    else:
        data = Store.from_url(url, **(storage_options or {})).read(url)
    actual = sha256_bytes(data)
    if actual != published.manifest.doc_index.sha256:
        raise HashMismatchError(url, published.manifest.doc_index.sha256, actual)
    return read_doc_index(pa.BufferReader(data), columns=columns, filters=filters)


def check_doc_index(source, manifest: Manifest) -> None:
    """Check a document index file against ``manifest``: the schema above, the row count it
    states, and every span inside a row of a shard it lists (``shard`` < its shard count, ``row``
    < that shard's rows, ``start + length`` <= seq_len + 1), sorted by (shard, row, start).

    Reads one row group (of four columns) at a time, so memory stays flat whatever the index size.
    """
    what = manifest.doc_index.path
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(source)
        schema = pf.schema_arrow
        _ = schema.names, str(schema)  # decode every name: one that is not UTF-8 fails here, not later
    except (pa.ArrowException, OSError, ValueError) as e:  # UnicodeDecodeError included
        raise ManifestError(f"{what}: not a readable Parquet file: {e}") from e
    if not any(schema.equals(s) for s in (DOC_INDEX_SCHEMA, *LEGACY_SCHEMAS)):
        raise FactMismatchError(what, "schema", "the document index schema of docs/format.md",
                                schema.to_string(show_schema_metadata=False).replace("\n", "; "))
    stated = manifest.doc_index.rows
    if stated is not None and pf.metadata.num_rows != stated:
        raise FactMismatchError(what, "doc_index.rows", stated, pf.metadata.num_rows)
    shard_rows = np.array([s.rows for s in manifest.shards], dtype=np.int64)
    rule = split_rule(manifest)
    is_validation = np.array([s.split == "validation" for s in manifest.shards], dtype=bool)
    width, seen, previous = manifest.row_tokens, 0, None
    for g in range(pf.num_row_groups):
        try:
            t = pf.read_row_group(g, columns=["shard", "row", "start", "length"] + (["doc_id"] if rule else []))
        except (pa.ArrowException, OSError, ValueError) as e:
            raise ManifestError(f"{what}: row group {g} cannot be read: {e}") from e
        shard, row, start, length = (t.column(k).to_numpy().astype(np.int64) for k in ("shard", "row", "start", "length"))
        bad = (shard < 0) | (shard >= shard_rows.size)
        _refuse(what, bad, seen, "shard", f"a position in manifest.shards (< {shard_rows.size})", shard)
        bad = (row < 0) | (row >= shard_rows[shard])
        _refuse(what, bad, seen, "row", "a row inside its shard (< the shard's rows)", row)
        bad = (start < 0) | (length < 1) | (start + length > width)
        _refuse(what, bad, seen, "start/length", f"a span inside a row of seq_len + 1 = {width} tokens",
                np.stack([start, length], axis=1).tolist() if bad.any() else None)
        keys = np.stack([shard, row, start], axis=1)
        if previous is not None:
            keys = np.concatenate([previous, keys])
        if len(keys) > 1:
            d = np.diff(keys, axis=0)
            ordered = (d[:, 0] > 0) | ((d[:, 0] == 0) & ((d[:, 1] > 0) | ((d[:, 1] == 0) & (d[:, 2] >= 0))))
            _refuse(what, ~ordered, seen + (previous is None), "order", "sorted by (shard, row, start)",
                    keys[1:].tolist() if not ordered.all() else None)
        previous = keys[-1:]
        if rule:
            fraction, salt = rule
            chosen = np.fromiter((stable_fraction(d, salt) < fraction for d in t.column("doc_id").to_pylist()), bool,
                                 count=t.num_rows)
            bad = chosen != is_validation[shard]
            if bad.any():
                k = int(np.argmax(bad))
                raise FactMismatchError(what, "split", f"config.split's rule (validation_fraction {fraction}, seed {salt})",
                                        f"span {seen + k}: document {t.column('doc_id')[k].as_py()!r} is "
                                        f"{'validation' if chosen[k] else 'train'} by the rule but in shards[{shard[k]}], "
                                        f"a {manifest.shards[shard[k]].split} shard (a shard relabelled?)")
        seen += t.num_rows


def split_rule(manifest: Manifest) -> tuple[float, int] | None:
    """(validation_fraction, seed) of a manifest `prepare` wrote (its config's ``split`` section),
    by which every document's split is :func:`stable_fraction` of its id; None for other writers."""
    split = manifest.config.get("split")
    if not isinstance(split, dict):
        return None
    fraction, seed = split.get("validation_fraction"), split.get("seed", 0)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or isinstance(seed, bool) or not isinstance(seed, int):
        return None
    return float(fraction), seed


def _refuse(what: str, bad: np.ndarray, offset: int, field: str, stated: str, values) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        raise FactMismatchError(what, field, stated, f"span {offset + i} with {field} {values[i]}")
