"""Check every file a manifest pins against everything the manifest states about it; name each one that differs.

Per file: it exists, its size and sha256. Then what the hash alone cannot vouch for, since a
manifest's facts can be wrong while its own hash is valid: a shard's schema, token dtype, row
width (seq_len + 1) and row count, every token id below ``vocab_size`` (a full scan), and its
uncompressed cache form's ``raw_sha256``/``raw_bytes``; the document index's schema, row count
and spans (inside the shards' rows, sorted); the tokenizer's vocabulary size; each dedup index
file's schema, MinHash parameters and row count (manifests.dedup_index).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import fsspec
import numpy as np
import pyarrow as pa

from .doc_index import check_doc_index
from .errors import FactMismatchError, HashMismatchError, ManifestError, PinnedFileError
from .hashing import sha256_bytes, sha256_stream
from .manifest import Shard
from .shards import check_vocab, checked_rows, read_table, write_shard
from .store import Published, join


@dataclass(frozen=True)
class Problem:
    path: str
    error: ManifestError  # the specific error (HashMismatchError, FactMismatchError, ...)

    @property
    def reason(self) -> str:
        return str(self.error)

    def __str__(self) -> str:
        return str(self.error)


def verify_published(published: Published, *, progress: Callable[[str], None] | None = None) -> list[Problem]:
    """Every pinned file (tokenizer, document index, shards) checked; one Problem per file that fails."""
    m = published.manifest
    checks = [(m.tokenizer.path, lambda: _check_tokenizer(published)), (m.doc_index.path, lambda: _check_doc_index(published))]
    checks += [(s.path, lambda s=s: _check_shard(published, s)) for s in m.shards]
    checks += [(f.path, lambda f=f: _check_dedup_index(published, f)) for f in m.dedup_index]
    problems = []
    for rel, check in checks:
        if progress:
            progress(rel)
        try:
            check()
        except ManifestError as e:
            problems.append(Problem(rel, e))
    return problems


def _open(published: Published, rel: str, read):
    url = join(published.url, rel)
    try:
        with fsspec.open(url, "rb") as f:
            return read(f)
    except FileNotFoundError as e:
        raise PinnedFileError(f"{rel}: missing ({url})") from e
    except OSError as e:
        raise PinnedFileError(f"{rel}: cannot be read ({url}): {e}") from e


def _check_pinned(rel: str, sha: str, actual: str, size: int | None, n: int) -> None:
    """The hash first: a file that fails it is not the pinned file; one that passes it with another
    size means the manifest's ``bytes`` is wrong."""
    if actual != sha:
        raise HashMismatchError(rel, sha, actual)
    if size is not None and n != size:
        raise FactMismatchError(rel, "bytes", size, n)


def verified_rows(published: Published, s: Shard) -> np.ndarray:
    """A published shard's ``(rows, seq_len + 1)`` tokens, after checking its sha256, size, schema,
    row count and token ids against the manifest (what an export must know before copying them)."""
    m = published.manifest
    data = _open(published, s.path, lambda f: f.read())  # a shard is bounded by the target shard size
    _check_pinned(s.path, s.sha256, sha256_bytes(data), s.bytes, len(data))
    rows = checked_rows(read_table(pa.py_buffer(data)), m, s)
    check_vocab(rows, m, s)
    return rows


def _check_shard(published: Published, s: Shard) -> None:
    rows = verified_rows(published, s)
    raw = write_shard(None, rows, compressed=False)
    if raw.sha256 != s.raw_sha256:
        raise HashMismatchError(f"{s.path} (its uncompressed cache form)", s.raw_sha256, raw.sha256)
    if raw.bytes != s.raw_bytes:
        raise FactMismatchError(s.path, "raw_bytes", s.raw_bytes, raw.bytes)


def _check_doc_index(published: Published) -> None:
    ref = published.manifest.doc_index
    actual, n = _open(published, ref.path, sha256_stream)  # streamed twice (hash, then row groups): it can be large
    _check_pinned(ref.path, ref.sha256, actual, ref.bytes, n)
    _open(published, ref.path, lambda f: check_doc_index(f, published.manifest))


def _check_dedup_index(published: Published, ref) -> None:
    from .dedup_index import read_checked

    read_checked(_open(published, ref.path, lambda f: f.read()), ref, ref.path)


def _check_tokenizer(published: Published) -> None:
    from tokenizers import Tokenizer  # only verify needs it

    m = published.manifest
    data = _open(published, m.tokenizer.path, lambda f: f.read())
    _check_pinned(m.tokenizer.path, m.tokenizer.sha256, sha256_bytes(data), None, len(data))
    try:
        tok = Tokenizer.from_str(data.decode())
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception for any bad file
        raise ManifestError(f"{m.tokenizer.path}: not a tokenizers tokenizer.json: {e}") from e
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab != m.tokenizer.vocab_size:
        raise FactMismatchError(m.tokenizer.path, "tokenizer.vocab_size", m.tokenizer.vocab_size, vocab)
