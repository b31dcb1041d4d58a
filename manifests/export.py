"""Exports of a published dataset version for other tools: Megatron-LM's indexed dataset and a Parquet view.

Both verify every shard they read against the manifest first (sha256, size, schema, rows, token
ids: ``verify.verified_rows``) and the document index by its sha256, and record the manifest hash
beside what they write, so the exported files trace back to one content-hashed version.

**Megatron** (``export_megatron``): ``OUT_PREFIX.bin`` + ``OUT_PREFIX.idx`` in the format of
``megatron/core/datasets/indexed_dataset.py`` (NVIDIA/Megatron-LM), written from its layout:

``.idx``, little-endian: ``b"MMIDIDX\\x00\\x00"``; version ``<Q`` 1; dtype code ``<B`` (Megatron's
``DType``: 8 = uint16, 4 = int32, ...); sequence count ``<Q``; document count ``<Q`` (sequences
+ 1); sequence lengths int32[sequences]; byte pointers int64[sequences] (into ``.bin``);
document indices int64[documents] (the sequence index at which each document starts, then the
total: ``0, 1, ..., sequences`` here). ``.bin``: the token ids of all sequences, back to back.

One sequence per document: the document's spans in the document index, in order (a document cut
across rows or shards is joined again), so Megatron's own ``GPTDataset`` packs and shuffles them
(with ``--reset-attention-mask`` / ``--reset-position-ids`` if wanted). Tokens of a range tail the
pipeline dropped were never in a row and are not exported. uint16 tokens stay uint16; uint32
tokens are written as int32 (Megatron has no uint32 code; its own preprocessing does the same).

**Views** (``export_view``): one file per shard of the chosen split(s), columns ``shard`` (its
position in ``manifest.shards``, the document index's ``shard``), ``row`` and ``tokens`` (a list of
``seq_len + 1`` ids), as Parquet (what DuckDB, Spark or polars read without Arrow IPC support; it
joins with ``doc_index.parquet`` on ``(shard, row)``) or as uncompressed Arrow streaming files
(what Hugging Face ``datasets.Dataset.from_file`` memory-maps; it reads no IPC *file* format).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import uuid

import numpy as np
import pyarrow as pa

from gristmill.errors import os_error_text

from .doc_index import read_published_doc_index
from .errors import ManifestError
from .hashing import sha256_file
from .provenance import code_version
from .runs import run_starts
from .storage import atomic_write
from .storage import nearest_dir
from .store import Published, load_manifest
from .verify import verified_rows

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
MEGATRON_DTYPE = {"uint16": (8, np.uint16), "uint32": (4, np.int32)}  # manifest dtype -> (Megatron code, written dtype)
RECORD_SUFFIX = ".gristmill.json"


class ExportError(ManifestError):
    """An export cannot be written as asked (a file in the way, an empty split); nothing was written."""


def document_spans(published: Published, split: str) -> tuple[pa.Table, np.ndarray]:
    """The split's spans (shard, row, start, length) in index order, and each span's document number:
    a document starts at a span with another doc_id than the span before it, or that does not start
    its row (a continuation always starts at token 0 of the next row)."""
    m = published.manifest
    spans = read_published_doc_index(published, columns=["shard", "row", "start", "length", "doc_id"])
    in_split = np.array([s.split == split for s in m.shards], dtype=bool)
    spans = spans.filter(pa.array(in_split[spans.column("shard").to_numpy()]))
    ids = spans.column("doc_id").combine_chunks().dictionary_encode().indices.to_numpy()
    new = run_starts(ids) | (spans.column("start").to_numpy() != 0)  # a new document, or a document's next span
    return spans.drop_columns(["doc_id"]), np.cumsum(new) - 1


def span_tokens(rows: np.ndarray, row: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The tokens of the spans ``(row, start, length)`` of one shard's rows, concatenated in order."""
    flat = rows.reshape(-1)
    first = row.astype(np.int64) * rows.shape[1] + start
    length = length.astype(np.int64)
    offsets = np.cumsum(length) - length
    return flat[np.repeat(first - offsets, length) + np.arange(int(length.sum()))]


def _check_output_dir(path: str) -> None:
    """Refuse, before any work, an output directory that cannot be one: a file is in its place or
    on the way to it (``out/x`` under a file ``out``)."""
    try:
        nearest_dir(path)
    except NotADirectoryError as e:
        raise ExportError(f"{e} is a file, not a directory; choose another output path") from None


@contextlib.contextmanager
def _writing(out: str):
    """An OSError while writing an export (a full disk, a path into /proc, a folder that cannot be
    made) is one ExportError naming the file: the export stages its files and moves them in last,
    so nothing that looks like output is left."""
    try:
        yield
    except OSError as e:
        raise ExportError(f"cannot write the export {out}: {os_error_text(e, fix='choose another output path')}; "
                          "nothing was exported") from e


@contextlib.contextmanager
def _removed_after(folder: str):
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _refuse_existing(paths: list[str], overwrite: bool) -> None:
    there = [p for p in paths if os.path.exists(p)]
    if there and not overwrite:
        raise ExportError(f"{', '.join(there)} already exist(s); choose another output or pass --overwrite")


def export_megatron(url: str, out_prefix: str, *, split: str = "train", expected_sha256: str | None = None,
                    overwrite: bool = False) -> dict:
    """Write ``out_prefix.bin``/``.idx`` (and ``out_prefix.gristmill.json``); returns the record."""
    pub = load_manifest(url, expected_sha256=expected_sha256)
    m = pub.manifest
    code, dtype = MEGATRON_DTYPE[m.token_dtype]
    bin_path, idx_path, record_path = out_prefix + ".bin", out_prefix + ".idx", out_prefix + RECORD_SUFFIX
    _refuse_existing([bin_path, idx_path, record_path], overwrite)
    spans, doc = document_spans(pub, split)
    # Nothing is written under the output names until every shard verified: the .bin is written under a
    # temporary name, and an old record (with --overwrite) goes before the new files replace its.
    if len(spans) == 0:
        raise ExportError(f"split {split!r} of {pub.url} has no document spans: nothing to export")
    lengths = np.bincount(doc, weights=spans.column("length").to_numpy()).astype(np.int64)
    if lengths.max() > np.iinfo(np.int32).max:
        raise ExportError(f"a document of {int(lengths.max()):,} tokens exceeds Megatron's int32 sequence length")
    shard_col = spans.column("shard").to_numpy()
    _check_output_dir(os.path.dirname(os.path.abspath(out_prefix)))
    with _writing(out_prefix):
        os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
        tmp = f"{bin_path}.tmp-{uuid.uuid4().hex[:12]}"
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as f:  # streamed a shard at a time: memory bounded by one shard
                for s in np.unique(shard_col).tolist():  # the index order is the manifest's shard order
                    sel = shard_col == s
                    rows = verified_rows(pub, m.shards[s])
                    part = span_tokens(rows, *(spans.column(k).to_numpy()[sel] for k in ("row", "start", "length")))
                    data = part.astype(dtype).tobytes()
                    digest.update(data)
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * np.dtype(dtype).itemsize
            header = MEGATRON_MAGIC + struct.pack("<Q", MEGATRON_VERSION) + struct.pack("<B", code)
            header += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(lengths) + 1)
            if os.path.exists(record_path):
                os.unlink(record_path)
            atomic_write(idx_path, header + lengths.astype(np.int32).tobytes() + pointers.astype(np.int64).tobytes()
                         + np.arange(len(lengths) + 1, dtype=np.int64).tobytes())
            os.replace(tmp, bin_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        record = {"format": "megatron-indexed-dataset", "manifest_sha256": m.sha256, "manifest_url": pub.url,
                  "dataset": m.dataset, "version": m.version, "split": split, "token_dtype": m.token_dtype,
                  "written_dtype": np.dtype(dtype).name, "megatron_dtype_code": code, "sequences": int(len(lengths)),
                  "tokens": int(lengths.sum()), "files": {os.path.basename(p): sha256_file(p)[0] for p in (bin_path, idx_path)},
                  "code_version": code_version()}
        try:
            atomic_write(record_path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
        except OSError:  # a .bin/.idx without its record is not an export: they go too
            for p in (bin_path, idx_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            raise
    return record


VIEW_FORMATS = {"parquet": ".parquet", "arrow-stream": ".arrows"}


def _view_bytes(table: pa.Table, fmt: str):
    sink = pa.BufferOutputStream()
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, sink, compression="zstd")
    else:  # uncompressed, so Dataset.from_file memory-maps it without a copy
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    return sink.getvalue()


def export_view(url: str, out_dir: str, fmt: str = "parquet", *, splits: tuple[str, ...] = ("train", "validation"),
                expected_sha256: str | None = None, overwrite: bool = False) -> dict:
    """Write one file per shard of ``splits`` under ``out_dir`` (the shard's path, another suffix) in
    ``fmt`` (``parquet``, or ``arrow-stream``: the Arrow streaming format ``datasets.Dataset.from_file``
    reads), and ``out_dir/gristmill.json`` recording the manifest hash and every file's sha256."""
    if fmt not in VIEW_FORMATS:
        raise ExportError(f"export format must be one of {', '.join(VIEW_FORMATS)}, got {fmt!r}")
    pub = load_manifest(url, expected_sha256=expected_sha256)
    m = pub.manifest
    chosen = [(i, s) for i, s in enumerate(m.shards) if s.split in splits]
    if not chosen:
        raise ExportError(f"{pub.url} has no shards in split(s) {', '.join(splits)}")
    rels = [os.path.splitext(s.path)[0] + VIEW_FORMATS[fmt] for _, s in chosen]
    _refuse_existing([os.path.join(out_dir, r) for r in rels + [VIEW_RECORD]], overwrite)
    out_dir = os.path.abspath(out_dir)
    _check_output_dir(out_dir)
    stage = os.path.join(os.path.dirname(out_dir), f".{os.path.basename(out_dir)}.tmp-{uuid.uuid4().hex[:12]}")
    files = {}
    with _writing(out_dir), _removed_after(stage):
        # Every file is staged beside out_dir and only moved in once all of them verified and were written:
        # a shard that fails verification leaves nothing that looks like output.
        for (i, s), rel in zip(chosen, rels):
            rows = verified_rows(pub, s)
            table = pa.table({"shard": pa.array(np.full(len(rows), i, np.int32)), "row": pa.array(np.arange(len(rows))),
                              "tokens": pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), rows.shape[1])})
            data = _view_bytes(table, fmt)
            atomic_write(os.path.join(stage, rel), data)
            files[rel] = hashlib.sha256(data).hexdigest()
        record = {"format": f"gristmill-{fmt}-view", "manifest_sha256": m.sha256, "manifest_url": pub.url,
                  "dataset": m.dataset, "version": m.version, "splits": list(splits), "seq_len": m.seq_len,
                  "files": files, "code_version": code_version()}
        atomic_write(os.path.join(stage, VIEW_RECORD), (json.dumps(record, indent=2, sort_keys=True) + "\n").encode())
        _move_in(stage, out_dir, rels)
    return record


VIEW_RECORD = "gristmill.json"


def _move_in(stage: str, out_dir: str, rels: list[str]) -> None:
    """Publish a complete staged export: the whole directory in one rename when ``out_dir`` does not
    exist; else (``--overwrite``, or an existing directory) the old record first, then each file, then
    the record last, so a directory holding a ``gristmill.json`` always holds all of what it lists."""
    if not os.path.exists(out_dir):
        try:
            os.rename(stage, out_dir)
            return
        except OSError:  # created meanwhile: move the files in one by one
            pass
    record = os.path.join(out_dir, VIEW_RECORD)
    if os.path.exists(record):
        os.unlink(record)
    for rel in rels:
        os.makedirs(os.path.dirname(os.path.join(out_dir, rel)), exist_ok=True)
        os.replace(os.path.join(stage, rel), os.path.join(out_dir, rel))
    os.replace(os.path.join(stage, VIEW_RECORD), record)
