"""The work dir: resumable stage outputs, committed atomically per partition.

Layout under ``<work_dir>/<run key>/`` (the key hashes the job's content and its input files,
so a changed job or input never reuses stale work)::

    <stage>/part-00007.parquet   the partition's output (written to a temp name, then renamed)
    _done/<stage>/part-00007.json  the completion marker: written last, holds the stats

A partition is finished iff its marker exists. A crash (even ``kill -9``) leaves at most temp
files and outputs without a marker; a rerun rewrites those, and the output is the same bytes
because every stage is deterministic.
"""
from __future__ import annotations

import json
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from manifests.hashing import canonical_json
from manifests.shards import atomic_write


def part_name(part: int) -> str:
    return f"part-{part:05d}"


class WorkDir:
    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, exist_ok=True)

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def marker(self, stage: str, name: str) -> str:
        return self.path("_done", stage, f"{name}.json")

    def done(self, stage: str, name: str) -> dict | None:
        """The stats of a finished unit of work, or None if it has to be (re)done."""
        try:
            with open(self.marker(stage, name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def mark_done(self, stage: str, name: str, stats: dict) -> None:
        atomic_write(self.marker(stage, name), canonical_json(stats))


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

