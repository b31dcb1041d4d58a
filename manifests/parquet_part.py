"""A Parquet file written as a stream and committed whole: nothing valid-looking before commit.

On a local disk it is written under a temp name and renamed into place; on any other store
(manifests/storage.py) it streams into a pending object that appears only on commit (on an object
store an upload completed then), and an abort leaves no object at all.
"""
from __future__ import annotations

import functools
import os

import pyarrow as pa

from .storage import Store, temp_name


class ParquetPart:
    """Stream record batches into ``path`` of ``store`` (None: the store of ``path`` with no storage
    options); ``commit()`` puts it in place.

    Always produces a file (an empty one with the schema when no rows came), so readers of a
    finished stage never have to guess whether a partition is missing or merely empty. The writer
    opens on the first rows: most of a big job's per-partition files are empty (a partition with
    no removals at a stage), and those are written as one cached file's bytes, ~10x cheaper.
    """

    def __init__(self, path: str, schema: pa.Schema, row_group_size: int | None = None, compression: str = "zstd",
                 store: Store | None = None):
        self.path, self.schema, self.row_group_size, self.compression = path, schema, row_group_size, compression
        self.store = store or Store.from_url(path)
        self.writer: pq.ParquetWriter | None = None
        self._local = self.tmp = self._pending_object = None
        self.rows = 0
        self._pending: dict[str, list] = {k: [] for k in schema.names}

    def _open_writer(self) -> None:
        if self.store.is_local:
            self._local = self.store.path(self.path)
            os.makedirs(os.path.dirname(self._local) or ".", exist_ok=True)
            self.tmp = temp_name(self._local)
            sink = self.tmp  # pyarrow's own file: faster than through a Python file object
        else:
            self._pending_object = self.store.pending(self.path)
            sink = self._pending_object.file  # pyarrow never closes a file it was handed
        import pyarrow.parquet as pq  # lazy: `gristmill serve` imports this module and never reads Parquet (its RSS at start, issue 41)

        self.writer = pq.ParquetWriter(sink, self.schema, compression=self.compression)

    def append(self, row: dict) -> None:
        """Buffer one row (a row group per row would make files slow to read)."""
        for k in self.schema.names:
            self._pending[k].append(row[k])
        if len(self._pending[self.schema.names[0]]) >= 4096:
            self._flush()

    def write(self, rows: dict | pa.Table) -> None:
        self._flush()
        table = rows if isinstance(rows, pa.Table) else pa.table(rows, schema=self.schema)
        if table.num_rows:
            if self.writer is None:
                self._open_writer()
            self.writer.write_table(table.select(self.schema.names).cast(self.schema), row_group_size=self.row_group_size)
            self.rows += table.num_rows

    def _flush(self) -> None:
        if self._pending[self.schema.names[0]]:
            pending, self._pending = self._pending, {k: [] for k in self.schema.names}
            self.write(pending)

    def commit(self) -> None:
        self._flush()
        if self.writer is None:
            self._commit_empty()
            return
        self.writer.close()
        if self._pending_object is not None:
            self._pending_object.commit()
        else:
            os.replace(self.tmp, self._local)

    def _commit_empty(self) -> None:
        # as a written part, no local fsync: the task's marker, fsynced after its outputs, commits it
        self.store.put(self.path, empty_parquet(self.schema, self.compression), sync=False)

    def abort(self) -> None:
        if self.writer is None:
            return  # nothing was opened
        self.writer.close()
        if self._pending_object is not None:
            self._pending_object.abort()
        elif os.path.exists(self.tmp):
            os.unlink(self.tmp)


@functools.lru_cache(maxsize=64)
def empty_parquet(schema: pa.Schema, compression: str = "zstd") -> bytes:
    """The bytes ``pq.ParquetWriter`` writes for no rows of ``schema``: the same every time (no
    timestamp in a Parquet file), so made once per process and schema."""
    sink = pa.BufferOutputStream()
    import pyarrow.parquet as pq

    pq.ParquetWriter(sink, schema, compression=compression).close()
    return sink.getvalue().to_pybytes()
