"""Token shards: Arrow IPC files with one ``fixed_size_list<uintN>[seq_len + 1]`` column.

One row per packed sequence, one record batch per file, so the uncompressed cache form
memory-maps into a single ``(rows, seq_len + 1)`` numpy view with no copy. Published files
are zstd-compressed at a fixed level; the same rows give byte-identical files (and the same
sha256) on every run. Anyone can open a shard with pyarrow, DuckDB or polars.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from .errors import FactMismatchError, HashMismatchError, ManifestError, TokenOutOfVocabError
from .manifest import Manifest, Shard
from .storage import Store, atomic_write

COLUMN = "tokens"
ZSTD_LEVEL = 3
SHARD_FORMAT = "gristmill-tokens-v1"


def shard_schema(row_tokens: int, dtype: str) -> pa.Schema:
    value_type = {"uint16": pa.uint16(), "uint32": pa.uint32()}[dtype]
    return pa.schema(
        [pa.field(COLUMN, pa.list_(pa.field("item", value_type, nullable=False), row_tokens), nullable=False)],
        metadata={b"format": SHARD_FORMAT.encode()},
    )


def _options(compressed: bool) -> ipc.IpcWriteOptions:
    return ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=ZSTD_LEVEL) if compressed else None)


@dataclass(frozen=True)
class ShardStats:
    sha256: str
    bytes: int
    rows: int
    tokens: int


def write_shard(path: str | None, rows: np.ndarray, *, compressed: bool = True, store: Store | None = None) -> ShardStats:
    """Write ``rows`` (shape ``(n, seq_len + 1)``, uint16/uint32) atomically to ``path`` of ``store``
    (None: the store of ``path``).

    The file appears under its final name only once complete: a crash mid-write leaves at
    most a ``.tmp`` file that no reader trusts. With ``path=None`` only the stats are computed
    (how the uncompressed cache form's hash is pinned without writing it).
    """
    if rows.ndim != 2 or rows.dtype not in (np.uint16, np.uint32):
        raise ValueError(f"rows must be a 2-D uint16/uint32 array, got shape {rows.shape} dtype {rows.dtype}")
    rows = np.ascontiguousarray(rows)
    n, width = rows.shape
    schema = shard_schema(width, rows.dtype.name)
    values = pa.array(rows.reshape(-1), type=schema.field(COLUMN).type.value_type)
    column = pa.FixedSizeListArray.from_arrays(values, width)
    batch = pa.record_batch([column], schema=schema)
    # Serialise in memory (a shard is bounded by the target shard size), hash, then write once.
    out = pa.BufferOutputStream()
    with ipc.new_file(out, schema, options=_options(compressed)) as w:
        w.write_batch(batch)
    data = out.getvalue()
    if path is not None:
        atomic_write(path, data, store)
    return ShardStats(sha256=hashlib.sha256(data).hexdigest(), bytes=data.size, rows=n, tokens=n * width)


def read_table(source) -> pa.Table:
    """Read a shard (compressed or not) from a path, buffer or file object.

    Arrow's structural validation runs too (buffer sizes against lengths, offsets): a crafted
    file is refused here rather than read past its buffers later.
    """
    try:
        # no Arrow thread pool: a pool task left at exit can abort the process ("terminate called
        # without an active exception", apache/arrow#34314; seen once at `gristmill train`'s exit)
        table = ipc.open_file(source, options=ipc.IpcReadOptions(use_threads=False)).read_all()
        table.validate()
        _ = table.schema.names, str(table.schema)  # decode every name: one that is not UTF-8 fails here, not later
        return table
    except (pa.ArrowException, OSError, ValueError) as e:  # UnicodeDecodeError included
        raise ManifestError(f"not a readable gristmill shard: {e}") from e


def rows_from_table(table: pa.Table, what: str = "shard") -> np.ndarray:
    """The ``(rows, seq_len + 1)`` token matrix of a shard table (zero-copy when uncompressed).

    Checks what the format fixes (metadata, one non-null fixed-size-list column of uint16/uint32)
    so that the matrix is exactly the table's rows; :func:`checked_rows` adds what a manifest states.
    """
    if table.schema.metadata is None or table.schema.metadata.get(b"format") != SHARD_FORMAT.encode():
        actual = (table.schema.metadata or {}).get(b"format", b"(none)").decode(errors="replace")
        raise FactMismatchError(what, "schema metadata format", SHARD_FORMAT, actual,
                                "not a gristmill token shard")
    t = table.schema.field(COLUMN).type if table.schema.names == [COLUMN] else None
    if t is None or not pa.types.is_fixed_size_list(t) or t.value_type not in (pa.uint16(), pa.uint32()):
        raise FactMismatchError(what, "schema", f"{COLUMN}: fixed_size_list<uint16|uint32>", table.schema.to_string(
            show_schema_metadata=False), "not a gristmill token shard")
    chunks = table.column(COLUMN).chunks
    arr = chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks) if chunks else pa.array([], type=t)
    flat = arr.flatten()  # exactly len(arr) * list_size values, whatever the child array holds beyond
    if arr.null_count or flat.null_count:
        raise FactMismatchError(what, "schema", "no null tokens", f"{arr.null_count + flat.null_count} nulls")
    return flat.to_numpy(zero_copy_only=True).reshape(len(arr), t.list_size)


def checked_rows(table: pa.Table, manifest: Manifest, shard: Shard) -> np.ndarray:
    """:func:`rows_from_table`, after checking the table against every fact ``manifest`` states
    about ``shard``: its row width (seq_len + 1), token dtype and row count. O(1): no token is read."""
    rows = rows_from_table(table, shard.path)
    dtype = rows.dtype.name
    if dtype != manifest.token_dtype:
        raise FactMismatchError(shard.path, "token_dtype", manifest.token_dtype, dtype)
    if rows.shape[1] != manifest.row_tokens:
        raise FactMismatchError(shard.path, "seq_len", f"{manifest.seq_len} (rows of seq_len + 1 = {manifest.row_tokens} "
                                f"tokens)", f"rows of {rows.shape[1]} tokens")
    if rows.shape[0] != shard.rows:
        raise FactMismatchError(shard.path, "rows", shard.rows, rows.shape[0])
    return rows


def check_vocab(rows: np.ndarray, manifest: Manifest, shard: Shard) -> None:
    """Every token id below the tokenizer's ``vocab_size``: a full scan (numpy's max, memory speed),
    skipped when the dtype cannot hold a larger id."""
    vocab = manifest.tokenizer.vocab_size
    if rows.size == 0 or vocab > np.iinfo(rows.dtype).max:
        return
    top = int(rows.max())
    if top >= vocab:
        r, c = np.unravel_index(int(np.argmax(rows >= vocab)), rows.shape)
        raise TokenOutOfVocabError(shard.path, "tokenizer.vocab_size", vocab,
                                   f"token id {top} (first out-of-vocabulary id at row {r}, position {c})")


def read_rows(path: str, *, expected_sha256: str | None = None) -> np.ndarray:
    """Read a whole shard into memory, verifying its sha256 while reading when one is given."""
    with open(path, "rb") as f:
        data = f.read()
    if expected_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256:
            raise HashMismatchError(path, expected_sha256, actual)
    return rows_from_table(read_table(pa.py_buffer(data)))


def write_cache_form(published_path: str, cache_path: str) -> ShardStats:
    """Decompress a published shard into the uncompressed, memory-mappable cache form."""
    rows = rows_from_table(read_table(published_path))
    return write_shard(cache_path, rows, compressed=False)


class MappedShard:
    """Random access by row into an uncompressed shard, memory-mapped with zero copies.

    With ``manifest`` and ``shard``, the file is checked against what the manifest states about
    it (:func:`checked_rows`) before anything is read through the mapping.
    """

    def __init__(self, path: str, manifest: Manifest | None = None, shard: Shard | None = None):
        self.path = path
        self._source = pa.memory_map(path, "r")
        try:
            table = read_table(self._source)
            # a view onto the mapping
            self.rows = checked_rows(table, manifest, shard) if manifest is not None else rows_from_table(table, path)
        except BaseException:
            self._source.close()
            raise
        self._table = table  # keeps the buffers alive

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, i):
        return self.rows[i]

    def take(self, row_ids: np.ndarray) -> np.ndarray:
        return self.rows[row_ids]

    def mapping(self) -> tuple[int, int]:
        """(address, size) of the file's memory mapping. ``rows`` lies inside it unless the table
        had several chunks, which are concatenated into ordinary memory."""
        self._source.seek(0)
        buf = self._source.read_buffer(self._source.size())  # zero-copy: a view of the mapping
        return buf.address, buf.size

    def close(self):
        self.rows = None
        self._table = None
        self._source.close()
