"""Re-hash every file a manifest pins and name each one that differs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .hashing import sha256_file
from .store import Published, join


@dataclass(frozen=True)
class Problem:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def verify_published(published: Published, *, progress: Callable[[str], None] | None = None) -> list[Problem]:
    """Every pinned file (tokenizer, document index, shards): exists, size and sha256 match."""
    m = published.manifest
    pinned = [(m.tokenizer.path, m.tokenizer.sha256, None), (m.doc_index.path, m.doc_index.sha256, m.doc_index.bytes)]
    pinned += [(s.path, s.sha256, s.bytes) for s in m.shards]
    problems = []
    for rel, sha, size in pinned:
        if progress:
            progress(rel)
        try:
            actual, n = sha256_file(join(published.url, rel))
        except FileNotFoundError:
            problems.append(Problem(rel, "missing"))
            continue
        if size is not None and n != size:
            problems.append(Problem(rel, f"size {n} bytes, manifest pins {size}"))
        elif actual != sha:
            problems.append(Problem(rel, f"sha256 {actual}, manifest pins {sha}"))
    return problems
