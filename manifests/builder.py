"""Assemble a dataset version in a local staging directory: shards, document index, manifest.

The pipeline's pack/publish steps and the tests both build datasets through this one class,
so there is a single writer of the format.
"""
from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np
import pyarrow as pa

from . import dedup_index as dx
from .doc_index import DocIndexWriter
from .hashing import sha256_file, sha256_json
from .manifest import (SCHEMA_VERSION, EvalSet, FileRef, Input, Manifest, PinnedVersion, Shard, Tokenizer,
                       token_dtype_for)
from .shards import write_shard
from .storage import Store

DOC_INDEX_FILE = "doc_index.parquet"
TOKENIZER_FILE = "tokenizer.json"


def write_pinned_shard(root: str, rel: str, split: str, rows: np.ndarray, store: Store | None = None) -> Shard:
    """Write one shard at ``root/rel`` of ``store`` and return its manifest entry, pinning both the
    published (zstd) file's hash and the uncompressed cache form's, computed from the same rows."""
    published = write_shard(os.path.join(root, rel), rows, store=store)
    raw = write_shard(None, rows, compressed=False)
    return Shard(rel, split, published.sha256, published.bytes, published.rows, published.tokens, raw.sha256, raw.bytes)


class DatasetBuilder:
    def __init__(self, staging_dir: str, *, dataset: str, seq_len: int, tokenizer_json: str, vocab_size: int, eos_id: int,
                 store: Store | None = None, tokenizer_store: Store | None = None, encoder: str = ""):
        """``store``: the staging dir's (None: its URL's, no options); ``tokenizer_store``: the
        tokenizer file's (None: its URL's); ``encoder``: what encoded the tokens ("" if unknown)."""
        self.dir = staging_dir
        self.store = store = store or Store.from_url(staging_dir)
        self.dataset, self.seq_len = dataset, seq_len
        self.dtype = token_dtype_for(vocab_size)
        target = os.path.join(staging_dir, TOKENIZER_FILE)
        source = tokenizer_store or Store.from_url(tokenizer_json)
        if store.is_local and source.is_local:
            store.makedirs(os.path.join(staging_dir, "shards"))
            shutil.copyfile(source.path(tokenizer_json), store.path(target))
        else:  # a staging dir or tokenizer on an object store
            store.put(target, source.read(tokenizer_json))
        sha, _ = sha256_file(target, store=store)
        self.tokenizer = Tokenizer(TOKENIZER_FILE, sha, vocab_size, eos_id, encoder)
        self.shards: list[Shard] = []
        self.doc_index: FileRef | None = None
        self.dedup_index: list[FileRef] = []

    def shard_path(self, split: str, number: int) -> str:
        return f"shards/{split}-{number:05d}.arrow"

    def add_shard(self, split: str, rows: np.ndarray, number: int | None = None) -> Shard:
        """Write one shard of ``(n, seq_len + 1)`` tokens; returns its manifest entry."""
        if rows.shape[1] != self.seq_len + 1:
            raise ValueError(f"rows are {rows.shape[1]} tokens wide; this dataset packs seq_len + 1 = {self.seq_len + 1}")
        number = sum(s.split == split for s in self.shards) if number is None else number
        shard = write_pinned_shard(self.dir, self.shard_path(split, number), split, rows.astype(self.dtype, copy=False),
                                   self.store)
        self.shards.append(shard)
        return shard

    # The document index's `shard` column is the position in self.shards: keep insertion order.
    @contextlib.contextmanager
    def doc_index_writer(self):
        """Stream the document index (see DocIndexWriter); pinned in the manifest when closed."""
        path = os.path.join(self.dir, DOC_INDEX_FILE)
        with DocIndexWriter(path, self.store) as w:
            yield w
        sha, size = sha256_file(path, store=self.store)
        self.doc_index = FileRef(DOC_INDEX_FILE, sha, size, w.rows)

    def set_doc_index(self, table: pa.Table) -> FileRef:
        """The whole document index at once (small datasets, tests)."""
        with self.doc_index_writer() as w:
            w.write(table)
        return self.doc_index

    def add_dedup_index(self, table: pa.Table) -> FileRef:
        """One dedup-index file (``manifests.dedup_index`` rows, e.g. one partition's), pinned in the
        manifest in the order added; its rows sorted by doc_id, as verify requires."""
        rel = f"dedup_index/part-{len(self.dedup_index):05d}.parquet"
        path = os.path.join(self.dir, rel)
        rows = dx.write(path, table.sort_by("doc_id"), self.store)
        sha, size = sha256_file(path, store=self.store)
        self.dedup_index.append(FileRef(rel, sha, size, rows))
        return self.dedup_index[-1]

    def manifest(self, *, inputs: list[Input], config: dict, code_version: str, stats: dict,
                 eval_sets: list[EvalSet] = (), dedup_against: list[PinnedVersion] = ()) -> Manifest:
        if self.doc_index is None:
            raise ValueError("set_doc_index() must be called before manifest()")
        return Manifest(
            dataset=self.dataset, tokenizer=self.tokenizer, seq_len=self.seq_len, token_dtype=self.dtype,
            shards=tuple(self.shards), doc_index=self.doc_index, inputs=tuple(inputs), config=config,
            config_sha256=sha256_json(config), code_version=code_version, stats=stats,
            eval_sets=tuple(eval_sets), dedup_index=tuple(self.dedup_index), dedup_against=tuple(dedup_against),
            schema_version=SCHEMA_VERSION,
        )
