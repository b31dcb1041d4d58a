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

import numpy as np
import pyarrow as pa

from .doc_index import check_doc_index, read_doc_index
from .errors import FactMismatchError, HashMismatchError, ManifestError, PinnedFileError
from .hashing import sha256_bytes, sha256_stream
from .manifest import Shard
from .shards import check_vocab, checked_rows, read_table, write_shard
from .storage import Store
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
    index_ok: list[bool] = []  # the shards' document ends are checked against an index that verified

    def doc_index():
        _check_doc_index(published)
        index_ok.append(True)

    checks = [("manifest.json", lambda: check_shard_order(m)), (m.tokenizer.path, lambda: _check_tokenizer(published)),
              (m.doc_index.path, doc_index)]
    checks += [(s.path, lambda i=i, s=s: _check_shard(published, s, i, bool(index_ok))) for i, s in enumerate(m.shards)]
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
        with published.store.open(url) if published.store is not None else Store.from_url(url).open(url) as f:
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


def check_shard_order(m) -> None:
    """docs/format.md's shard order: every train shard, then every validation shard."""
    splits = [s.split for s in m.shards]
    if "validation" in splits and "train" in splits[splits.index("validation"):]:
        i = splits.index("validation") + splits[splits.index("validation"):].index("train")
        raise FactMismatchError("manifest.json", f"shards[{i}].split", "every train shard before every validation shard",
                                f"train after shards[{splits.index('validation')}] (validation)")


def _check_shard(published: Published, s: Shard, i: int, index_ok: bool) -> None:
    rows = verified_rows(published, s)
    if index_ok:
        _check_document_ends(published, s, i, rows)
    raw = write_shard(None, rows, compressed=False)
    if raw.sha256 != s.raw_sha256:
        raise HashMismatchError(f"{s.path} (its uncompressed cache form)", s.raw_sha256, raw.sha256)
    if raw.bytes != s.raw_bytes:
        raise FactMismatchError(s.path, "raw_bytes", s.raw_bytes, raw.bytes)


def _check_document_ends(published: Published, s: Shard, i: int, rows: np.ndarray) -> None:
    """The document index's spans of shard ``i`` against the shard's tokens: documents are packed
    with EOS after each, so a span that ends inside its row (a document's last span) ends with
    ``eos_id``. A shard moved to another position in the manifest (two shards' order swapped) holds
    other documents' layout and fails this. Spans outside the shard's rows are the index check's."""
    m = published.manifest
    spans = _open(published, m.doc_index.path, lambda f: _spans_of(f, i))
    row, start, length = (spans.column(k).to_numpy().astype(np.int64) for k in ("row", "start", "length"))
    end = start + length
    ends_inside = (end < m.row_tokens) & (row >= 0) & (row < rows.shape[0]) & (start >= 0) & (length >= 1)
    r, e = row[ends_inside], end[ends_inside] - 1
    wrong = rows[r, e] != m.tokenizer.eos_id
    if wrong.any():
        k = int(np.argmax(wrong))
        raise FactMismatchError(s.path, f"shards[{i}] documents", f"document index spans ending with eos_id "
                                f"{m.tokenizer.eos_id}", f"row {int(r[k])} token {int(e[k])} is {int(rows[r[k], e[k]])} where a "
                                f"span ends ({int(wrong.sum())} such spans): not the shard the index places at position {i} "
                                f"(shards reordered?)")


def _spans_of(f, i: int):
    try:
        return read_doc_index(f, columns=["row", "start", "length"], filters=[("shard", "==", i)])
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ManifestError(f"document index cannot be read for shard {i}: {e}") from e


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
    tok_config = m.config.get("tokenizer")
    eos_token = tok_config.get("eos_token") if isinstance(tok_config, dict) else None
    if isinstance(eos_token, str) and tok.token_to_id(eos_token) != m.tokenizer.eos_id:  # prepare's config names it
        raise FactMismatchError(m.tokenizer.path, "tokenizer.eos_id", m.tokenizer.eos_id,
                                f"{tok.token_to_id(eos_token)!r} for config.tokenizer.eos_token {eos_token!r}")
