"""The dedup index of a published version: what a later run needs to deduplicate against it.

One row per document the version kept, in Parquet (zstd), pinned by the manifest like the shards
(``manifest.dedup_index``: a list of files, each with its sha256, bytes and rows):

- ``doc_id``: the document's id, as in the document index;
- ``exact``: the first 8 bytes of the blake2b-128 of its normalised text
  (``pipeline.text.normalize``), the key exact dedup compares; a reader takes two documents for
  exact copies only when their keys *and* sketches are equal, so a 64-bit key collision between
  two different texts is not enough to remove one;
- ``sketch``: the low ``bits`` bits of each of the first ``bands x rows`` MinHash values of its
  signature (b-bit minwise hashing, Li & Koenig 2010), packed big-end first (two 4-bit values a
  byte); null for a document without words.

The parameters (``ngram``, ``num_perm``, ``seed``, ``bands``, ``rows``, ``bits``) are the file's
Parquet key-value metadata (inside the hashed bytes), so a run can refuse an index it cannot
compare with. From a sketch a reader gets both things fuzzy dedup needs without the earlier
text: **band keys** (band ``b``'s ``rows`` values as one integer: a pair of Jaccard J shares a band
with probability ``(J + (1 - J) / 2**bits) ** rows``), and a **similarity estimate**, the fraction
of equal values corrected for chance agreement (``estimate``), with a standard error of about
0.037 at J = 0.8 over 126 values at 4 bits (0.036 at 8: the low bits lose little where it
matters). At the default 4 bits: 8 + 63 bytes a document plus its id, ~75 bytes.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from .errors import FactMismatchError, HashMismatchError, ManifestError
from .hashing import sha256_bytes
from .parquet_part import ParquetPart
from .storage import Store

FORMAT = 1
META_KEY = b"gristmill.dedup_index"
PARAMS = ("ngram", "num_perm", "seed", "bands", "rows", "bits")
BITS = (4, 8)  # the sketch widths this format knows
EXACT_BYTES = 8
ROW_GROUP_ROWS = 1 << 16  # fixed: the bytes (hence the hash) do not depend on how rows were batched


def schema(params: dict) -> pa.Schema:
    """The index schema for these MinHash parameters (their metadata included)."""
    p = check_params(params, "dedup index")
    return pa.schema([pa.field("doc_id", pa.string(), nullable=False),
                      pa.field("exact", pa.binary(EXACT_BYTES), nullable=False),
                      pa.field("sketch", pa.binary(sketch_bytes(p)))],
                     metadata={META_KEY: json.dumps({"format": FORMAT, **p}, sort_keys=True).encode()})


def check_params(params: dict, what: str) -> dict:
    if not isinstance(params, dict) or any(k not in params for k in PARAMS):
        raise ManifestError(f"{what}: MinHash parameters must state {', '.join(PARAMS)}, got {params!r}")
    p = {k: params[k] for k in PARAMS}
    if any(isinstance(v, bool) or not isinstance(v, int) for v in p.values()) or \
            min(p["ngram"], p["num_perm"], p["bands"], p["rows"]) < 1 or p["bands"] * p["rows"] > p["num_perm"] or \
            p["bits"] not in BITS:
        raise ManifestError(f"{what}: MinHash parameters must be positive integers with bands x rows <= num_perm "
                            f"and bits one of {BITS}, got {p!r}")
    return p


def sketch_bytes(p: dict) -> int:
    return -(-p["bands"] * p["rows"] * p["bits"] // 8)


# -- sketches -------------------------------------------------------------------------------------
def sketches(signatures: np.ndarray, p: dict) -> np.ndarray:
    """``(docs, sketch_bytes(p))`` uint8: the low ``bits`` bits of each of the first bands x rows
    MinHash values, packed (4 bits: the even-numbered value in the high half of a byte)."""
    n = p["bands"] * p["rows"]
    v = (np.asarray(signatures, dtype=np.uint32)[:, :n] & np.uint32((1 << p["bits"]) - 1)).astype(np.uint8)
    if p["bits"] == 8:
        return v
    if n % 2:
        v = np.concatenate([v, np.zeros((len(v), 1), np.uint8)], axis=1)
    return (v[:, 0::2] << np.uint8(4)) | v[:, 1::2]


def values(sk: np.ndarray, p: dict) -> np.ndarray:
    """``(docs, bands * rows)`` uint8: the sketch values, unpacked."""
    sk = np.atleast_2d(np.asarray(sk, dtype=np.uint8))
    n = p["bands"] * p["rows"]
    if p["bits"] == 8:
        return sk[:, :n]
    v = np.empty((len(sk), 2 * sk.shape[1]), np.uint8)
    v[:, 0::2], v[:, 1::2] = sk >> np.uint8(4), sk & np.uint8(15)
    return v[:, :n]


def sketch_band_keys(sk: np.ndarray, p: dict) -> np.ndarray:
    """``(docs, bands)`` uint64: band b's ``rows`` values as one integer (``rows * bits <= 64``), or
    a 64-bit FNV-style fold of them. Equal bands give equal keys; keys of different bands are told
    apart by their band number, kept beside them by the caller."""
    bands, rows, bits = p["bands"], p["rows"], p["bits"]
    v = values(sk, p).reshape(-1, bands, rows).astype(np.uint64)
    h = np.zeros(v.shape[:2], dtype=np.uint64)
    for j in range(rows):
        h = (h << np.uint64(bits)) | v[:, :, j] if rows * bits <= 64 else (h ^ v[:, :, j]) * np.uint64(0x100000001B3)
    return h


def estimate(a: np.ndarray, b: np.ndarray, p: dict) -> np.ndarray:
    """Estimated Jaccard of sketch pairs (``a[i]`` with ``b[i]``): the fraction of equal values,
    corrected for two unequal MinHash values agreeing in their low bits (1 in 2**bits)."""
    chance = 1.0 / (1 << p["bits"])
    frac = (values(a, p) == values(b, p)).mean(axis=1)
    return np.clip((frac - chance) / (1 - chance), 0.0, 1.0)


def exact_keys(norm_hashes) -> list[bytes]:
    """The ``exact`` column from exact dedup's hex ``norm_hash`` values (16-byte blake2b): their
    first 8 bytes."""
    out = [bytes.fromhex(h)[:EXACT_BYTES] for h in norm_hashes]
    if any(len(k) != EXACT_BYTES for k in out):
        raise ValueError(f"norm_hash must be at least {EXACT_BYTES} bytes of hex")
    return out


def table(params: dict, doc_ids, norm_hashes, sk: np.ndarray | None, has_words=None) -> pa.Table:
    """Index rows for documents: ids, their exact keys, their sketches (null where ``has_words`` is
    false: a document without words resembles nothing)."""
    s = schema(params)
    n = len(doc_ids)
    width = s.field("sketch").type.byte_width
    if sk is None:
        sketch = pa.nulls(n, s.field("sketch").type)
    else:
        sk = np.ascontiguousarray(np.asarray(sk, np.uint8).reshape(n, width))
        sketch = pa.FixedSizeBinaryArray.from_buffers(s.field("sketch").type, n, [None, pa.py_buffer(sk.tobytes())])
        if has_words is not None and not np.all(has_words):
            import pyarrow.compute as pc

            sketch = pc.if_else(pa.array(np.asarray(has_words, bool)), sketch, pa.scalar(None, s.field("sketch").type))
    return pa.table({"doc_id": pa.array(list(doc_ids), pa.string()),
                     "exact": pa.array(exact_keys(norm_hashes), pa.binary(EXACT_BYTES)), "sketch": sketch}, schema=s)


def _bits(buf, offset: int, n: int, if_none: bool) -> np.ndarray:
    """``n`` bits of an Arrow bitmap from bit ``offset`` as bools (``if_none`` where there is none)."""
    if buf is None:
        return np.full(n, if_none, bool)
    return np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")[offset:offset + n].astype(bool)


def bool_values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A boolean column without nulls as a numpy array, read from its bitmap (pyarrow's own
    conversion imports pandas, ~0.3 s in a fresh worker)."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return _bits(col.buffers()[1], col.offset, len(col), False)


def sketch_matrix(column: pa.ChunkedArray | pa.Array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, width)`` uint8 of a ``sketch`` column (zeros where null) and a mask of the rows with one."""
    import pyarrow.compute as pc

    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = _bits(col.buffers()[0], col.offset, len(col), True)
    if col.null_count:
        col = pc.fill_null(col, pa.scalar(b"\0" * width, pa.binary(width)))
    m = np.frombuffer(col.buffers()[1], dtype=np.uint8, count=len(col) * width, offset=col.offset * width)
    return m.reshape(len(col), width), valid


# -- files ----------------------------------------------------------------------------------------
def write(path: str, t: pa.Table, store: Store | None = None) -> int:
    """Write index rows to ``path`` of ``store`` (None: the store of ``path``) atomically, in fixed
    row groups (equal rows, equal bytes)."""
    out = ParquetPart(path, t.schema, row_group_size=ROW_GROUP_ROWS, store=store)
    out.write(t)
    out.commit()
    return t.num_rows


def params_of(pf, what: str) -> dict:  # pf: a pyarrow.parquet.ParquetFile
    meta = pf.schema_arrow.metadata or {}
    if META_KEY not in meta:
        raise ManifestError(f"{what}: not a dedup index (no {META_KEY.decode()} metadata)")
    try:
        d = json.loads(meta[META_KEY])
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{what}: unreadable dedup index metadata: {e}") from e
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ManifestError(f"{what}: dedup index format {d.get('format') if isinstance(d, dict) else d!r}; "
                            f"this gristmill reads format {FORMAT}")
    return check_params(d, what)


def read_checked(data: bytes, ref, what: str) -> tuple[pa.Table, dict]:
    """An index file's rows and parameters, from its bytes, checked against its manifest entry
    ``ref`` (a ``manifest.FileRef``): sha256, bytes, rows and schema. A file whose bytes differ from
    what the manifest pins is refused like a forged shard (``HashMismatchError``)."""
    actual = sha256_bytes(data)
    if actual != ref.sha256:
        raise HashMismatchError(what, ref.sha256, actual)
    if len(data) != ref.bytes:
        raise FactMismatchError(what, "bytes", ref.bytes, len(data))
    try:
        import pyarrow.parquet as pq  # lazy: `gristmill serve` imports this module and never reads Parquet (its RSS at start, issue 41)

        pf = pq.ParquetFile(pa.BufferReader(data))
        t = pf.read()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ManifestError(f"{what}: not a readable Parquet file: {e}") from e
    params = params_of(pf, what)
    want = schema(params)
    if not t.schema.remove_metadata().equals(want.remove_metadata()):
        raise FactMismatchError(what, "schema", "the dedup index schema of docs/format.md",
                                t.schema.remove_metadata().to_string().replace("\n", "; "))
    if ref.rows is not None and t.num_rows != ref.rows:
        raise FactMismatchError(what, "rows", ref.rows, t.num_rows)
    if t.column("doc_id").null_count or t.column("exact").null_count:
        raise FactMismatchError(what, "doc_id/exact", "no nulls", "a null")
    ids = t.column("doc_id").combine_chunks()
    if len(ids) > 1:
        import pyarrow.compute as pc

        ordered = pc.less(ids.slice(0, len(ids) - 1), ids.slice(1))  # byte order, as the writer sorts
        if not pc.all(ordered).as_py():
            i = pc.index(ordered, False).as_py()
            raise ManifestError(f"{what}: doc_id {ids[i].as_py()!r} (row {i}) is not followed by a greater one "
                                f"({ids[i + 1].as_py()!r}): an index file's doc_ids are strictly increasing (sorted, "
                                "each once)")
    return t, params


def read_published(published, storage_options: dict | None = None) -> tuple[pa.Table, dict]:
    """Every dedup-index file of a published version (``manifests.Published``), hash-checked, as one
    table, and the MinHash parameters they share. A version published without an index is refused
    with what to do."""
    from .store import join

    m = published.manifest
    if not m.dedup_index:
        raise ManifestError(f"{published.url}: {m.dataset} v{m.version} was published without a dedup index "
                            f"(before gristmill wrote one); publish it again with this gristmill to dedup against it")
    tables, params = [], None
    for ref in m.dedup_index:
        url = join(published.url, ref.path)
        with Store.from_url(url, **(storage_options or {})).open(url) as f:
            data = f.read()
        t, p = read_checked(data, ref, url)
        if params is not None and p != params:
            raise FactMismatchError(url, "MinHash parameters", params, p)
        params = p
        tables.append(t.replace_schema_metadata(None))
    out = pa.concat_tables(tables)
    check_unique_ids(out.column("doc_id"), published.url)
    return out, params


def check_unique_ids(ids, what: str) -> None:
    """Each file's ids are strictly increasing (``read_checked``); across files, none twice."""
    import pyarrow.compute as pc

    if len(pc.unique(ids)) != len(ids):
        counts = pc.value_counts(ids)
        twice = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        raise ManifestError(f"{what}: the dedup index holds doc_id {twice!r} more than once (in two of its files)")
