"""The unique-ids step's files: extract writes a partition's ids (``ids_table``), the step's tasks read
ranges of their buckets and name the repeated ids (``repeated_ids``, which exact dedup leaves to it).
pipeline/stages/unique_ids runs the step."""
from __future__ import annotations

import hashlib

import pyarrow as pa

from .workdir import WorkDir

STAGE = "unique_ids"
BUCKETS = 1 << 16  # id buckets (a 16-bit hash of the id), as exact dedup's keys: tasks take ranges of them
KEYS_PER_TASK = 2_000_000  # as exact dedup's: about 160 MB of ids per task at most
ID_SCHEMA = pa.schema([("bucket", pa.int32()), ("id", pa.string()), ("order", pa.int64()), ("part", pa.int32()),
                       ("bytes", pa.int64()), ("kept", pa.bool_()), ("source", pa.string()), ("position", pa.int64())])


def needs_id_check(job) -> bool:
    """Ids come from the data (some input of the job, a PrepareConfig, has an id_field): check they are unique."""
    return any(spec.id_field is not None for spec in job.inputs)


def bucket_of(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=2).digest(), "big") % BUCKETS


def ids_table(rows: dict) -> pa.Table:
    """A partition's ids (``rows``: a list per ID_SCHEMA column but ``bucket``), sorted by (bucket, order)."""
    t = pa.table({"bucket": [bucket_of(i) for i in rows["id"]], **{k: rows[k] for k in ID_SCHEMA.names[1:]}}, schema=ID_SCHEMA)
    return t.sort_by([("bucket", "ascending"), ("order", "ascending")])


def repeated_ids(wd: WorkDir, tasks: tuple[str, ...]) -> set[str]:
    """The ids this step removed (exact dedup's keys must not stand for them): one small file a task."""
    out: set[str] = set()
    for name in tasks:
        out.update(wd.read_parquet(wd.scratch(STAGE, "repeated", name), ["id"]).column("id").to_pylist())
    return out
