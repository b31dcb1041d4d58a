"""Document ids are unique by construction: the ``unique_ids`` step (jobs with an ``id_field``).

Every later stage removes, overrides and indexes documents by id, so two documents sharing one
(a user's ``id_field`` that repeats, in one file or across files and partitions) would stand
for each other: removing one as a duplicate made the other vanish, uncounted. Ids derived from
provenance (``<file>:<record>``) are unique; ids taken from the data are checked here.

The rule (docs/pipeline.md, "Document ids"): **an id carried by more than one input record
keeps none of them.** Every copy that the language filter kept is removed with reason
``duplicate_id`` (stage ``unique_ids``), its detail naming how many records share the id and
where the first of them is (file and record); copies the language filter removed stay counted
there. Which of two documents called "B" the id means is not knowable, so neither is
published under it; both stay inspectable (``gristmill inspect removed``) and the accounting
balances. The result depends on the data only, never on the partitioning: the check is global.

How it scales, like exact dedup: extract writes per partition every good record's id with a
16-bit hash bucket of it, sorted by bucket (``ids/part-*.parquet``); a task takes a range of
buckets and reads only those rows of every partition (row-group pruning), so it holds
``1/tasks`` of the ids. A repeated id lives in one bucket, so tasks are independent.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from gristmill.manifests.runs import run_starts

from ...documents import REMOVED_SCHEMA, bucket_range_tasks, removed_by_partition
from ...workdir import WorkDir

from ...id_files import BUCKETS, ID_SCHEMA, KEYS_PER_TASK, STAGE, bucket_of, ids_table, needs_id_check, repeated_ids  # noqa: F401
REASON = "duplicate_id"
def plan_tasks(total_docs: int) -> list[dict]:
    """Bucket ranges as exact dedup plans them (the same buckets, the same rows per task)."""
    return bucket_range_tasks(total_docs, BUCKETS, KEYS_PER_TASK)


def repeated(ids: pa.Table) -> pa.Table:
    """The rows to remove: every language-kept row whose id another row also has, sorted by
    order, in REMOVED_SCHEMA; ``detail`` says how many share the id and where the first is."""
    if ids.num_rows == 0:
        return REMOVED_SCHEMA.empty_table()
    ids = ids.sort_by([("id", "ascending"), ("order", "ascending")])
    key = np.asarray(ids.column("id").to_pylist(), dtype=object)
    start = run_starts(key)
    group = np.cumsum(start) - 1
    first = np.flatnonzero(start)
    size = np.diff(np.append(first, len(key)))[group]
    take = (size > 1) & ids.column("kept").to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(take)
    src, pos = ids.column("source").to_pylist(), ids.column("position").to_pylist()
    details = [json.dumps({"copies": int(size[r]), "first": f"{src[first[group[r]]]} record {pos[first[group[r]]]}",
                           "this": f"{src[r]} record {pos[r]}"}, sort_keys=True) for r in rows]
    idx = pa.array(rows, pa.int64())
    out = pa.table({"id": ids.column("id").take(idx), "order": ids.column("order").take(idx),
                    "part": ids.column("part").take(idx), "bytes": ids.column("bytes").take(idx),
                    "stage": pa.array([STAGE] * len(rows), pa.string()), "reason": pa.array([REASON] * len(rows), pa.string()),
                    "detail": pa.array(details, pa.string()), "text": pa.nulls(len(rows), pa.string())}, schema=REMOVED_SCHEMA)
    return out.sort_by("order")


def check_task(task: dict, wd: WorkDir, parts: list[int]) -> dict:
    """One bucket range over every partition's ids: its repeated ids' rows, sorted by order (so
    by partition: each partition's ``removed_task`` reads only its own row groups)."""
    flt = [("bucket", ">=", task["lo"]), ("bucket", "<", task["hi"])]
    ids = pa.concat_tables([wd.read_parquet(f, filters=flt, schema=ID_SCHEMA)
                            for f in wd.whole_files([wd.ids(p) for p in parts])]) if parts \
        else ID_SCHEMA.empty_table()
    removed = repeated(ids)
    out = wd.part(wd.scratch(STAGE, "repeated", task["name"]), REMOVED_SCHEMA, row_group_size=16_384)
    out.write(removed)
    out.commit()
    return {"ids": ids.num_rows, "repeated": removed.num_rows}


def removed_task(item: dict, wd: WorkDir, tasks: list[str]) -> dict:
    """Partition ``part``'s rows from every bucket range's file: its rows of ``removed/unique_ids/block-B``."""
    return removed_by_partition(wd, STAGE, "repeated", tasks, item["part"], REMOVED_SCHEMA, REASON)
