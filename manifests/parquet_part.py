"""A Parquet file written as a stream and committed by rename: nothing valid-looking before commit."""
from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq


class ParquetPart:
    """Stream record batches into ``path`` under a temp name; ``commit()`` renames it into place.

    Always produces a file (an empty one with the schema when no rows came), so readers of a
    finished stage never have to guess whether a partition is missing or merely empty.
    """

    def __init__(self, path: str, schema: pa.Schema, row_group_size: int | None = None, compression: str = "zstd"):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path, self.schema, self.row_group_size = path, schema, row_group_size
        self.tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        self.writer = pq.ParquetWriter(self.tmp, schema, compression=compression)
        self.rows = 0
        self._pending: dict[str, list] = {k: [] for k in schema.names}

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
            self.writer.write_table(table.select(self.schema.names).cast(self.schema), row_group_size=self.row_group_size)
            self.rows += table.num_rows

    def _flush(self) -> None:
        if self._pending[self.schema.names[0]]:
            pending, self._pending = self._pending, {k: [] for k in self.schema.names}
            self.write(pending)

    def commit(self) -> None:
        self._flush()
        self.writer.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.writer.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)

