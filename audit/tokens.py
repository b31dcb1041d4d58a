"""The text a model actually saw: token spans read from the pinned shards, detokenized.

Why tokens and not the raw inputs: the shards are what the trainer consumed, pinned by the
manifest's hashes; the input files may be gone, remote, or differ from the trained text after
extraction and filtering, and a document cut off by the end of a run was only partly seen.
Reading the spans of the rows that were consumed answers about exactly those tokens. The
tokenizer.json the manifest pins turns them back into text; n-gram matching normalises case,
punctuation and whitespace, so the detokenizer's spacing does not matter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import fsspec
import numpy as np
import pyarrow as pa

from manifests import HashMismatchError, Manifest, Published, join, sha256_bytes
from manifests.shards import read_table, rows_from_table


def load_tokenizer(published: Published):
    """The manifest's tokenizer.json, hash-checked, as a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    url = join(published.url, published.manifest.tokenizer.path)
    with fsspec.open(url, "rb") as f:
        data = f.read()
    if sha256_bytes(data) != published.manifest.tokenizer.sha256:
        raise HashMismatchError(url, published.manifest.tokenizer.sha256, sha256_bytes(data))
    return Tokenizer.from_str(data.decode())


class ShardReader:
    """Whole shards read once each through fsspec and checked against the manifest's sha256."""

    def __init__(self, published: Published):
        self.published = published
        self._rows: dict[int, np.ndarray] = {}

    def rows(self, shard: int) -> np.ndarray:
        if shard not in self._rows:
            s = self.published.manifest.shards[shard]
            url = join(self.published.url, s.path)
            with fsspec.open(url, "rb") as f:
                data = f.read()
            actual = sha256_bytes(data)
            if actual != s.sha256:
                raise HashMismatchError(url, s.sha256, actual)
            self._rows[shard] = rows_from_table(read_table(pa.py_buffer(data)))
        return self._rows[shard]


@dataclass(frozen=True)
class Piece:
    """A maximal run of consecutive consumed spans of one document, as text."""

    doc_id: str
    keys: tuple[int, ...]  # row keys (see seen.row_offsets) of the spans in this piece
    text: str
    tokens: int


def seen_pieces(manifest: Manifest, spans: pa.Table, offsets: np.ndarray, reader: ShardReader, tokenizer,
                *, batch: int = 1024) -> Iterator[list[Piece]]:
    """Yield, in batches, the seen text of every document, split where an unconsumed span interrupts it.

    ``spans`` is the document index with a ``tokens_seen`` column (seen.seen_spans), restricted
    to documents with at least one consumed span and sorted by (doc_id, shard, row, start).
    """
    eos = manifest.tokenizer.eos_id
    pending: list[tuple[str, tuple[int, ...], list[int]]] = []

    def flush():
        texts = tokenizer.decode_batch([t for _, _, t in pending], skip_special_tokens=True)
        out = [Piece(d, k, txt, len(t)) for (d, k, t), txt in zip(pending, texts)]
        pending.clear()
        return out

    cols = {c: spans.column(c).to_numpy() for c in ("shard", "row", "start", "length", "tokens_seen")}
    doc_ids = spans.column("doc_id").to_pylist()
    current: tuple[str, list[int], list[int]] | None = None  # doc, keys, tokens
    for i, doc in enumerate(doc_ids):
        if current is not None and (doc != current[0] or cols["tokens_seen"][i] == 0):
            pending.append((current[0], tuple(current[1]), current[2]))
            current = None
            if len(pending) >= batch:
                yield flush()
        if cols["tokens_seen"][i] == 0:
            continue
        shard, row, start, length = (int(cols[c][i]) for c in ("shard", "row", "start", "length"))
        tokens = reader.rows(shard)[row, start:start + length]
        tokens = tokens[tokens != eos].tolist()
        if current is None:
            current = (doc, [], [])
        current[1].append(int(offsets[shard] + row))
        current[2].extend(tokens)
    if current is not None:
        pending.append((current[0], tuple(current[1]), current[2]))
    if pending:
        yield flush()
