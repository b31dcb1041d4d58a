"""Exact dedup: documents whose normalised text (``pipeline.text.normalize``) hashes equal.

Which copy survives: the one with the lowest ``order`` (the earliest in the sorted input
files, then the earliest record in its file). That is a property of the data, not of the
schedule, so it is the same whatever the number of workers or blocks. Every other copy is
removed with ``duplicate_of`` = the survivor's id.
"""
from __future__ import annotations

import pyarrow as pa

from .stage import StageResult

REASON = "exact_duplicate"
_EMPTY = pa.schema([("id", pa.string()), ("order", pa.int64()), ("part", pa.int32()), ("bytes", pa.int64()), ("reason", pa.string()),
                    ("duplicate_of", pa.string())])


def _duplicates_in_group(group: pa.Table) -> pa.Table:
    """All rows of one hash group but the earliest; a group of one (the usual case) yields none."""
    if group.num_rows < 2:
        return _EMPTY.empty_table()
    group = group.sort_by("order")
    first = group.column("id")[0].as_py()
    rest = group.slice(1)
    n = rest.num_rows
    return pa.table({"id": rest.column("id"), "order": rest.column("order"), "part": rest.column("part"),
                     "bytes": rest.column("bytes"), "reason": pa.array([REASON] * n), "duplicate_of": pa.array([first] * n)}, schema=_EMPTY)


def find_exact_duplicates(docs) -> StageResult:
    """``docs``: a ray.data.Dataset with at least id, order, part, norm_hash."""
    removed = (docs.select_columns(["id", "order", "part", "bytes", "norm_hash"])
               .groupby("norm_hash").map_groups(_duplicates_in_group, batch_format="pyarrow"))
    return StageResult(kept=None, removed=removed, stats={})

