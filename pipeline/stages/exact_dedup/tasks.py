"""Exact dedup: documents whose normalised text (``pipeline.text.normalize``) hashes equal.

Which copy survives: the one with the lowest ``order`` (the earliest in the sorted input
files, then the earliest record in its file). That is a property of the data, not of the
schedule, so it is the same whatever the number of workers or blocks. Every other copy is
removed with ``duplicate_of`` = the survivor's id.

How it scales: the extract stage writes, per partition, the dedup keys (hash, order, id)
sorted by a 16-bit hash bucket. Here each task takes a range of buckets and reads only those
rows of every partition (row-group pruning on the sorted bucket column), so a task holds
``1/tasks`` of the keys (about 80 bytes a document), never the text. A hash group lives in
one bucket, so tasks are independent. (Ray Data's own groupby was 40 s on the 1,400-document
demo on 2 cores; this is well under a second.)
"""
from __future__ import annotations


import numpy as np
import pyarrow as pa

from gristmill.manifests.runs import run_starts

from ...exact_keys import BUCKETS, KEY_SCHEMA, KEYS_PER_TASK, bucket_of, keys_table  # noqa: F401
from ...documents import REMOVED_SCHEMA, bucket_range_tasks, removed_by_partition, to_removed_rows
from ...workdir import WorkDir

STAGE = "exact_dedup"
REASON = "exact_duplicate"
_ROW_GROUP = 16_384  # duplicates rows: a partition's rows are a few row groups
REMOVED = pa.schema([("id", pa.string()), ("order", pa.int64()), ("part", pa.int32()), ("bytes", pa.int64()),
                     ("reason", pa.string()), ("duplicate_of", pa.string()), ("duplicate_of_order", pa.int64())])


def find_exact_duplicates(keys: pa.Table) -> pa.Table:
    """Every row whose ``norm_hash`` an earlier row (lower ``order``) already has, sorted by order."""
    if keys.num_rows == 0:
        return REMOVED.empty_table()
    keys = keys.sort_by([("norm_hash", "ascending"), ("order", "ascending")])
    h = np.asarray(keys.column("norm_hash").to_pylist(), dtype=object)
    first = run_starts(h)
    survivor = np.maximum.accumulate(np.where(first, np.arange(len(h)), 0))  # index of each group's first row
    dup = ~first
    ids = keys.column("id").to_numpy(zero_copy_only=False)
    orders = keys.column("order").to_numpy()
    out = pa.table({"id": keys.column("id").filter(dup), "order": keys.column("order").filter(dup),
                    "part": keys.column("part").filter(dup), "bytes": keys.column("bytes").filter(dup),
                    "reason": pa.array([REASON] * int(dup.sum()), pa.string()),
                    "duplicate_of": pa.array(ids[survivor[dup]], pa.string()),
                    "duplicate_of_order": pa.array(orders[survivor[dup]], pa.int64())}, schema=REMOVED)
    return out.sort_by("order")


def plan_tasks(total_docs: int) -> list[dict]:
    """Contiguous bucket ranges, enough of them that no task holds more than KEYS_PER_TASK keys."""
    return bucket_range_tasks(total_docs, BUCKETS, KEYS_PER_TASK)


def dedup_task(task: dict, wd: WorkDir, parts: list[int], exclude_tasks: tuple[str, ...] = ()) -> dict:
    """One bucket range over every partition's keys: its duplicates, sorted by order (so by
    partition: each partition's ``removed_task`` reads only its own row groups). ``exclude_tasks``:
    the unique_ids step's tasks, whose repeated ids are out of the run (neither survivor nor duplicate)."""
    flt = [("bucket", ">=", task["lo"]), ("bucket", "<", task["hi"])]
    keys = pa.concat_tables([wd.read_parquet(f, filters=flt, schema=KEY_SCHEMA)
                             for f in wd.whole_files([wd.keys(p) for p in parts])]) if parts \
        else KEY_SCHEMA.empty_table()
    if exclude_tasks:
        from ...id_files import repeated_ids

        if gone := repeated_ids(wd, exclude_tasks):
            keys = keys.filter(pa.array([i not in gone for i in keys.column("id").to_pylist()], pa.bool_()))
    removed = find_exact_duplicates(keys)
    out = wd.part(wd.scratch(STAGE, "duplicates", task["name"]), REMOVED, row_group_size=_ROW_GROUP)
    out.write(removed)
    out.commit()
    return {"keys": keys.num_rows, "duplicates": removed.num_rows}


def removed_task(item: dict, wd: WorkDir, tasks: list[str]) -> dict:
    """Partition ``part``'s duplicates from every bucket range's file: its rows of ``removed/exact_dedup/block-B``."""
    return removed_by_partition(wd, STAGE, "duplicates", tasks, item["part"], REMOVED, REASON,
                                convert=lambda t: to_removed_rows(t, STAGE))

