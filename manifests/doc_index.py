"""The document index: a Parquet table mapping every token span back to its document.

One row per (document, shard row) span, sorted by (shard, row, start), so the audit can go
from "rows a model saw" to "documents it saw" with a join and no replay of training.
"""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ManifestError

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


def write_doc_index(path: str, table: pa.Table) -> None:
    """Write atomically and deterministically (fixed row-group size, no wall-clock metadata)."""
    try:
        table = table.select(DOC_INDEX_SCHEMA.names).cast(DOC_INDEX_SCHEMA)
    except (KeyError, pa.ArrowInvalid) as e:
        raise ManifestError(f"document index does not match the schema in docs/format.md: {e}") from e
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(table, tmp, compression="zstd", row_group_size=1 << 20, write_statistics=True)
    os.replace(tmp, path)


def read_doc_index(source, columns: list[str] | None = None) -> pa.Table:
    table = pq.read_table(source, columns=columns)
    missing = set(columns or DOC_INDEX_SCHEMA.names) - set(table.schema.names)
    if missing:
        raise ManifestError(f"document index lacks column(s) {sorted(missing)}")
    return table
