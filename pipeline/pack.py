"""Pack tokenized documents into rows of ``seq_len + 1`` tokens, shards, and the document index.

Documents are concatenated in global ``order`` (EOS already follows each) and cut into rows; a
document may continue into the next row. The tail that does not fill a whole row is dropped
and counted (``tokens_dropped_tail``). A shard holds ``shard_bytes // row bytes`` rows (the
last one fewer). Packing is a single sequential pass: it is what makes the output independent
of how the parallel stages were scheduled, and it is cheap (array copies, no text).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests import DatasetBuilder
from manifests.doc_index import DOC_INDEX_SCHEMA

_IDX = DOC_INDEX_SCHEMA.names


class SplitPacker:
    def __init__(self, builder: DatasetBuilder, split: str, seq_len: int, shard_bytes: int):
        self.b, self.split, self.width = builder, split, seq_len + 1
        itemsize = np.dtype(builder.dtype).itemsize
        self.rows_per_shard = max(1, shard_bytes // (self.width * itemsize))
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.offset = 0  # global token offset in this split's stream
        self.shards_written = 0
        self.index = {k: [] for k in _IDX}
        self.stats = {"documents": 0, "tokens_in": 0, "rows": 0, "shards": 0, "tokens_dropped_tail": 0}

    def add(self, table: pa.Table) -> None:
        """Append a batch of tokenized documents (already in global order)."""
        lists = table.column("tokens").combine_chunks()
        lengths = pc.list_value_length(lists).to_numpy()
        values = lists.flatten().to_numpy()
        self.pending.append(values)
        self.pending_tokens += len(values)
        for doc_id, source, position, lang, n in zip(table.column("id").to_pylist(), table.column("source").to_pylist(),
                                                     table.column("position").to_pylist(), table.column("lang").to_pylist(), lengths):
            self._spans(doc_id, source, position, lang, int(n))
        self.stats["documents"] += table.num_rows
        self.stats["tokens_in"] += len(values)
        shard_tokens = self.rows_per_shard * self.width
        while self.pending_tokens >= shard_tokens:
            self._emit(shard_tokens)

    def _spans(self, doc_id, source, position, lang, n: int) -> None:
        g = self.offset
        self.offset += n
        while n > 0:
            row, start = divmod(g, self.width)
            length = min(self.width - start, n)
            shard, row_in_shard = divmod(row, self.rows_per_shard)
            for k, v in zip(_IDX, (shard, row_in_shard, start, length, doc_id, source, position, lang)):
                self.index[k].append(v)
            g += length
            n -= length

    def _emit(self, n_tokens: int) -> None:
        flat = np.concatenate(self.pending)
        rows, rest = flat[:n_tokens], flat[n_tokens:]
        self.pending, self.pending_tokens = [rest], len(rest)
        self.b.add_shard(self.split, rows.reshape(-1, self.width), number=self.shards_written)
        self.shards_written += 1
        self.stats["rows"] += n_tokens // self.width
        self.stats["shards"] += 1

    def finish(self, shard_base: int) -> pa.Table:
        """Write the last (short) shard; returns this split's document-index spans.

        ``shard_base`` is the position of this split's first shard in the manifest's list.
        """
        full = (self.pending_tokens // self.width) * self.width
        if full:
            self._emit(full)
        self.stats["tokens_dropped_tail"] = self.pending_tokens
        self.pending, self.pending_tokens = [], 0
        total_rows = self.stats["rows"]
        t = pa.table({k: self.index[k] for k in _IDX})
        if t.num_rows:
            global_row = np.asarray(self.index["shard"], np.int64) * self.rows_per_shard + np.asarray(self.index["row"], np.int64)
            t = t.filter(pa.array(global_row < total_rows))  # spans inside the dropped tail point nowhere
            t = t.set_column(0, "shard", pa.array(np.asarray(t.column("shard").to_numpy()) + shard_base, pa.int32()))
        self.index = {k: [] for k in _IDX}
        return t.cast(DOC_INDEX_SCHEMA)


def pack_split(builder: DatasetBuilder, token_files: list[str], split: str, seq_len: int, shard_bytes: int,
               batch_rows: int = 4096) -> tuple[pa.Table, dict]:
    """Pack one split from the tokenize stage's partition files, read in partition order."""
    packer = SplitPacker(builder, split, seq_len, shard_bytes)
    shard_base = len(builder.shards)
    for f in token_files:  # sorted by partition; rows inside a partition are in order already
        pf = pq.ParquetFile(f)
        for batch in pf.iter_batches(batch_size=batch_rows):
            t = pa.Table.from_batches([batch])
            t = t.filter(pc.equal(t.column("split"), split))
            if t.num_rows:
                packer.add(t)
    index = packer.finish(shard_base)
    return index, packer.stats
