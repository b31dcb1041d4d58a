"""Content hashing: the one place gristmill turns bytes and JSON into sha256 identities."""
from __future__ import annotations

import hashlib
import json
from typing import Any, BinaryIO


CHUNK = 8 << 20


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: equal content always gives equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(obj: Any) -> str:
    return sha256_bytes(canonical_json(obj))


def stable_fraction(key: str, salt: int) -> float:
    """A uniform number in [0, 1) that depends only on ``key`` and ``salt``: the train/validation
    split rule (a document is validation when this is below ``split.validation_fraction``), which
    `prepare` applies and `manifest verify` checks."""
    h = hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def sha256_stream(f: BinaryIO) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    while chunk := f.read(CHUNK):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def sha256_file(url: str, *, store=None, **storage_options) -> tuple[str, int]:
    """(sha256, size) of a file of ``store`` (a ``manifests.storage.Store``), else of any fsspec URL
    opened with ``storage_options``, streamed so memory stays flat."""
    from .storage import Store

    with (store or Store.from_url(url, **storage_options)).open(url) as f:
        return sha256_stream(f)
