"""The document index: a Parquet table mapping every token span back to its document.

One row per (document, shard row) span, sorted by (shard, row, start), so the audit can go
from "rows a model saw" to "documents it saw" with a join and no replay of training.
"""
from __future__ import annotations


import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ManifestError
from .parquet_part import ParquetPart

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
    ]
)


ROW_GROUP_ROWS = 1 << 16  # a fixed row-group size keeps the bytes (hence the hash) independent of batching


class DocIndexWriter:
    """Stream spans into the index file, in order, with memory bounded by one row group.

    Rows are written in groups of exactly ``ROW_GROUP_ROWS`` (the last one shorter) whatever
    the sizes of the tables handed to :meth:`write`, and with no wall-clock metadata, so equal
    spans give equal bytes. The file appears under its name only on :meth:`close`; a writer
    that fails or is abandoned leaves a temp file, never a valid-looking index.
    """

    def __init__(self, path: str):
        self.part = ParquetPart(path, DOC_INDEX_SCHEMA, row_group_size=ROW_GROUP_ROWS)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def write(self, table: pa.Table) -> None:
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


def read_doc_index(source, columns: list[str] | None = None) -> pa.Table:
    table = pq.read_table(source, columns=columns)
    missing = set(columns or DOC_INDEX_SCHEMA.names) - set(table.schema.names)
    if missing:
        raise ManifestError(f"document index lacks column(s) {sorted(missing)}")
    return table
