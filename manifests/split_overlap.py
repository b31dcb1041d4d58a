"""Whether a mixture's components would train on one another's validation documents.

Two versions of one dataset, split with another seed or fraction (or one of them before a change
of the split rule), put some of the same documents on different sides: a mixture of both then
trains on documents its own validation split measures (issue 39: 148 of v2's 287 validation
documents were in v1's training split). ``mix`` refuses such a mixture unless the job opts in
(``allow_split_overlap``), and then records what was found in the mixture manifest
(``split_overlaps``), so the overlap is part of what the mixture pins.

A document is known by its content where both components have a dedup index (the ``exact`` key of
its normalised text: the same document in two datasets, whatever its id), else, between versions
of one dataset, by its id.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .dedup_index import read_published
from .doc_index import read_published_doc_index
from .store import Published


@dataclass(frozen=True)
class SplitOverlap:
    """``documents`` of component ``validation``'s ``of`` validation documents are training
    documents of component ``training``, known ``by`` content or doc_id."""

    validation: str
    training: str
    documents: int
    of: int
    by: str

    def line(self) -> str:
        return (f"{self.documents:,} of component {self.validation!r}'s {self.of:,} validation documents are in "
                f"component {self.training!r}'s training split (same {self.by})")


def _identities(pub: Published, by: str) -> tuple[pa.Array, pa.Array]:
    """(validation, train) identities of a version's documents, each unique."""
    index = read_published_doc_index(pub, columns=["shard", "doc_id"])
    validation = np.array([s.split == "validation" for s in pub.manifest.shards], dtype=bool)
    is_val = pa.array(validation[index.column("shard").to_numpy()])
    ids = index.column("doc_id")
    val, train = pc.unique(ids.filter(is_val)), pc.unique(ids.filter(pc.invert(is_val)))
    if by == "doc_id":
        return val, train
    table, _ = read_published(pub)
    keys, doc_ids = table.column("exact").cast(pa.binary()), table.column("doc_id")
    return tuple(pc.unique(pc.take(keys, pc.index_in(side, value_set=doc_ids).drop_null())) for side in (val, train))


def split_overlaps(components: list[tuple[str, Published]]) -> list[SplitOverlap]:
    """Every (validation component, training component) pair whose documents overlap, in component order.
    A pair is compared by content where both have a dedup index, by doc_id where both are versions of
    one dataset (ids mean the same document there), and not at all otherwise (nothing says which
    documents two unrelated datasets share)."""
    sides: dict[tuple[int, str], tuple[pa.Array, pa.Array]] = {}

    def side(i: int, by: str) -> tuple[pa.Array, pa.Array]:
        if (i, by) not in sides:
            sides[i, by] = _identities(components[i][1], by)
        return sides[i, by]

    found = []
    for i, (name, pub) in enumerate(components):
        for j, (other, opub) in enumerate(components):
            by = "content" if pub.manifest.dedup_index and opub.manifest.dedup_index else \
                "doc_id" if pub.manifest.dataset == opub.manifest.dataset else None
            if j == i or by is None or not any(s.split == "validation" for s in pub.manifest.shards):
                continue
            val = side(i, by)[0]
            if n := pc.sum(pc.is_in(val, value_set=side(j, by)[1])).as_py() or 0:
                found.append(SplitOverlap(name, other, n, len(val), by))
    return found
