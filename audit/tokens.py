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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.manifests import HashMismatchError, Manifest, Published, join, sha256_bytes
from gristmill.manifests.runs import run_starts
from gristmill.manifests.shards import read_table, rows_from_table
from gristmill.manifests.storage import Store


def load_tokenizer(published: Published):
    """The manifest's tokenizer.json, hash-checked, as a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    url = join(published.url, published.manifest.tokenizer.path)
    data = Store.from_url(url).read(url)
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
            data = Store.from_url(url).read(url)
            actual = sha256_bytes(data)
            if actual != s.sha256:
                raise HashMismatchError(url, s.sha256, actual)
            self._rows[shard] = rows_from_table(read_table(pa.py_buffer(data)))
        return self._rows[shard]


@dataclass(frozen=True)
class Piece:
    """A maximal run of consecutive consumed spans of one document, as text."""

    doc_id: str
    first_span: int  # row of its first span in the spans table given to seen_pieces
    keys: tuple[int, ...]  # row keys (see seen.row_offsets) of the spans in this piece
    text: str
    tokens: int


def seen_pieces(manifest: Manifest, spans: pa.Table, offsets: np.ndarray, reader: ShardReader, tokenizer,
                *, batch: int = 1024) -> Iterator[list[Piece]]:
    """Yield, in batches, the seen text of every document, split where an unconsumed span interrupts it.

    ``spans`` is the document index with a ``tokens_seen`` column (seen.seen_spans), ordered so
    each document's spans are consecutive and in index order (shard, row, start).
    """
    seen = spans.column("tokens_seen").to_numpy() > 0
    doc = pc.dictionary_encode(spans.column("doc_id")).combine_chunks().indices.to_numpy()
    # A piece starts at a seen span whose predecessor is another document's or was not seen.
    boundary = run_starts(doc)
    boundary[1:] |= ~seen[:-1]
    span_ids = np.flatnonzero(seen)
    piece_starts = np.flatnonzero(boundary[span_ids])
    piece_ends = np.append(piece_starts[1:], len(span_ids))
    shard, row, start, length = (spans.column(c).to_numpy().astype(np.int64) for c in ("shard", "row", "start", "length"))
    doc_ids = spans.column("doc_id")
    eos = manifest.tokenizer.eos_id
    for b in range(0, len(piece_starts), batch):
        pieces = []
        for a, e in zip(piece_starts[b:b + batch], piece_ends[b:b + batch]):
            ids = span_ids[a:e]
            tokens = np.concatenate([reader.rows(shard[i])[row[i], start[i]:start[i] + length[i]] for i in ids])
            pieces.append((ids[0], tuple((offsets[shard[ids]] + row[ids]).tolist()), tokens[tokens != eos]))
        texts = tokenizer.decode_batch([t.tolist() for _, _, t in pieces], skip_special_tokens=True)
        yield [Piece(doc_ids[int(i)].as_py(), int(i), keys, text, len(t)) for (i, keys, t), text in zip(pieces, texts)]
