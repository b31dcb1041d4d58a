"""Pack tokenized documents into rows of ``seq_len + 1`` tokens, shards, and the document index.

Documents are concatenated in global ``order`` (EOS already follows each) and cut into rows; a
document may continue into the next row. A shard holds ``shard_bytes // row bytes`` rows (the
last one of a range fewer).

Packing runs in parallel over fixed *ranges* of each split's token stream (``pack.range_tokens``
tokens of document starts a range), planned from the tokenize stage's per-partition token
counts: positions in the document sequence, never the worker count or the file grouping. Each
range is one Ray task that packs its documents, in ``order``, into its own shards
(``shards/<split>-<range>-<n>.arrow``) and its own slice of the document index (shard numbers
local to the range). The tail of a range that does not fill a whole row is dropped and counted
(``tokens_dropped_tail``), at most ``seq_len`` tokens a range. A last task merges the slices
into the one document index, offsetting shard numbers to their place in the manifest (train
shards of every range in range order, then validation). So the output, and the manifest hash,
are a function of the documents alone: the same for any worker count, any partitioning and
after any resume.
"""
from __future__ import annotations

import bisect
from dataclasses import asdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gristmill.errors import ConfigError
from gristmill.manifests import DatasetBuilder, Shard, sha256_file
from gristmill.manifests.doc_index import DOC_INDEX_SCHEMA, DocIndexWriter
from gristmill.manifests.manifest import token_dtype_for
from gristmill.manifests.builder import write_pinned_shard
from gristmill.manifests.storage import Store

from ...workdir import WorkDir

from ...handoffs import SPLITS  # noqa: F401 (pack.SPLITS: the splits in manifest order)
# Pack tasks per split at most: 2^18 ranges of the default 64 Mi tokens are 16 Ti tokens. A larger
# corpus raises pack.range_tokens (the error says to what); one task per token planned forever.
MAX_PACK_TASKS = 1 << 18

_IDX = DOC_INDEX_SCHEMA.names


class SplitPacker:
    """One split's packing pass. Spans go to the document index as soon as their rows are in a
    written shard, so memory is one shard plus the spans of its rows, whatever the corpus size."""

    def __init__(self, builder: DatasetBuilder | RangeShards, split: str, seq_len: int, shard_bytes: int,
                 index: DocIndexWriter):
        self.b, self.split, self.width, self.index_writer = builder, split, seq_len + 1, index
        itemsize = np.dtype(builder.dtype).itemsize
        self.rows_per_shard = max(1, shard_bytes // (self.width * itemsize))
        self.shard_base = len(builder.shards)  # this split's shards follow the ones already added
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.offset = 0  # global token offset in this split's stream
        self.shards_written = 0
        self.index = {k: [] for k in _IDX}
        self.span_rows: list[int] = []  # split-global row of each buffered span, ascending
        self.stats = {"documents": 0, "tokens_in": 0, "rows": 0, "shards": 0, "tokens_dropped_tail": 0}

    def add(self, table: pa.Table) -> None:
        """Append a batch of tokenized documents (already in global order)."""
        lists = table.column("tokens").combine_chunks()
        lengths = pc.list_value_length(lists).to_numpy()
        values = lists.flatten().to_numpy().astype(self.b.dtype)  # held in the shard's dtype: half of uint32
        self.pending.append(values)
        self.pending_tokens += len(values)
        cols = [table.column(k).to_pylist() for k in ("id", "source", "position", "lang", "url")]
        for doc_id, source, position, lang, url, n in zip(*cols, lengths):
            self._spans(doc_id, source, position, lang, url, int(n))
        self.stats["documents"] += table.num_rows
        self.stats["tokens_in"] += len(values)
        shard_tokens = self.rows_per_shard * self.width
        while self.pending_tokens >= shard_tokens:
            self._emit(shard_tokens)

    def _spans(self, doc_id, source, position, lang, url, n: int) -> None:
        g = self.offset
        self.offset += n
        while n > 0:
            row, start = divmod(g, self.width)
            length = min(self.width - start, n)
            shard, row_in_shard = divmod(row, self.rows_per_shard)
            for k, v in zip(_IDX, (self.shard_base + shard, row_in_shard, start, length, doc_id, source, position, lang,
                                     url)):
                self.index[k].append(v)
            self.span_rows.append(row)
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
        self._flush_index()

    def _flush_index(self) -> None:
        """Write the spans whose rows are now in a shard; spans past the last row stay (or, at the
        end, are the dropped tail: they point nowhere)."""
        n = bisect.bisect_left(self.span_rows, self.stats["rows"])
        if n:
            self.index_writer.write(pa.table({k: v[:n] for k, v in self.index.items()}))
            for v in self.index.values():
                del v[:n]
            del self.span_rows[:n]

    def finish(self) -> None:
        """Write the last (short) shard and the remaining spans that land in it."""
        full = (self.pending_tokens // self.width) * self.width
        if full:
            self._emit(full)
        self.stats["tokens_dropped_tail"] = self.pending_tokens
        self.pending, self.pending_tokens = [], 0


class RangeShards:
    """Where one range's packer puts its shards: ``shards/<split>-<range>-<n>.arrow`` in staging,
    each pinned by both hashes as ``DatasetBuilder.add_shard`` does."""

    def __init__(self, staging: str, range_no: int, vocab_size: int, store: Store | None = None):
        self.dir, self.range_no, self.store = staging, range_no, store
        self.dtype = token_dtype_for(vocab_size)
        self.shards: list[Shard] = []

    def add_shard(self, split: str, rows: np.ndarray, number: int) -> Shard:
        rel = f"shards/{split}-{self.range_no:05d}-{number:05d}.arrow"
        shard = write_pinned_shard(self.dir, rel, split, rows.astype(self.dtype, copy=False), self.store)
        self.shards.append(shard)
        return shard


def plan_ranges(tokens_per_part: dict[str, list[int]], range_tokens: int) -> list[dict]:
    """Pack tasks: per split, range k holds the documents whose first token falls in
    ``[k * range_tokens, (k + 1) * range_tokens)`` of that split's token stream. Ranges are
    positions in the document sequence, so they do not depend on how files were grouped into
    partitions, nor on the worker count; each lists the partitions it must read."""
    items = []
    for split in SPLITS:
        counts = tokens_per_part[split]
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if counts else np.zeros(0, np.int64)
        ends = (starts + np.asarray(counts, np.int64)).tolist() if counts else []
        starts_l = starts.tolist()
        total = int(sum(counts))
        tasks = -(-total // range_tokens)
        if tasks > MAX_PACK_TASKS:
            raise ConfigError(f"pack.range_tokens: {range_tokens:,} makes {tasks:,} pack tasks of the {split} split's "
                              f"{total:,} tokens, more than {MAX_PACK_TASKS:,}; set it to at least "
                              f"{-(-total // MAX_PACK_TASKS):,}")
        for k in range(tasks):
            lo, hi = k * range_tokens, (k + 1) * range_tokens
            # the partitions overlapping [lo, hi) are a contiguous run: found by bisection, not a scan of all
            first, last = bisect.bisect_right(ends, lo), bisect.bisect_left(starts_l, hi)
            parts = [p for p in range(first, last) if counts[p]]
            items.append({"name": f"{split}-{k:05d}", "split": split, "range": k, "lo": lo, "hi": hi, "parts": parts,
                          "offsets": [int(starts[p]) for p in parts]})
    return items


def range_docs(wd: WorkDir, token_file: str, split: str, offset: int, lo: int, hi: int, batch_rows: int = 1024):
    """The documents of one partition's ``split`` whose first token (at split offset ``offset`` +
    tokens before it in this partition) falls in ``[lo, hi)``, in order."""
    pos = offset
    for batch in wd.iter_batches(token_file, batch_size=batch_rows):
        t = pa.Table.from_batches([batch])
        t = t.filter(pc.equal(t.column("split"), split))
        if not t.num_rows:
            continue
        lengths = pc.list_value_length(t.column("tokens")).to_numpy()
        starts = pos + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        pos += int(lengths.sum())
        keep = (starts >= lo) & (starts < hi)
        if keep.any():
            yield t.filter(pa.array(keep))
        if pos >= hi:
            return


def pack_range_task(item: dict, wd: WorkDir, seq_len: int, shard_bytes: int, vocab_size: int) -> dict:
    """Pack one range of one split: its shards (in ``wd.staging``) and its document-index slice."""
    sink = RangeShards(wd.staging, item["range"], vocab_size, wd.store)
    path = wd.pack_index(item["name"])
    with DocIndexWriter(path, wd.store) as index:
        packer = SplitPacker(sink, item["split"], seq_len, shard_bytes, index)
        for p, off in zip(item["parts"], item["offsets"]):
            for t in range_docs(wd, wd.tokens(p), item["split"], off, item["lo"], item["hi"]):
                packer.add(t)
        packer.finish()
    return {"split": item["split"], "stats": packer.stats, "shards": [asdict(s) for s in sink.shards], "index": path}


def merge_doc_index(item: dict, wd: WorkDir, slices: list[tuple[str, int]], out_path: str) -> dict:
    """Concatenate the ranges' index slices in manifest order; ``base`` turns a slice's shard
    number (a position in its range's shard list) into a position in the manifest's."""
    with DocIndexWriter(out_path, wd.store) as w:
        for path, base in slices:
            for batch in wd.iter_batches(path, batch_size=1 << 16):
                t = pa.Table.from_batches([batch])
                w.write(t.set_column(0, "shard", pc.add(t.column("shard"), base).cast(t.schema.field("shard").type)))
    rows = w.rows  # after close: the last row group is written then
    sha, size = sha256_file(out_path, store=wd.store)
    return {"sha256": sha, "bytes": size, "rows": rows}


def pack_split(builder: DatasetBuilder | RangeShards, token_files: list[str], split: str, seq_len: int, shard_bytes: int,
               index: DocIndexWriter, batch_rows: int = 1024) -> dict:
    """Pack one split from the tokenize stage's partition files, read in partition order; returns its stats."""
    packer = SplitPacker(builder, split, seq_len, shard_bytes, index)
    for f in token_files:  # sorted by partition; rows inside a partition are in order already
        pf = pq.ParquetFile(f)
        for batch in pf.iter_batches(batch_size=batch_rows):
            t = pa.Table.from_batches([batch])
            t = t.filter(pc.equal(t.column("split"), split))
            if t.num_rows:
                packer.add(t)
    packer.finish()
    return packer.stats
