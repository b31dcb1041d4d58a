"""Exact dedup's key files: extract writes a partition's keys (``keys_table``), exact dedup's tasks read
ranges of their buckets (pipeline/stages/exact_dedup)."""
from __future__ import annotations

import pyarrow as pa

BUCKETS = 1 << 16  # key buckets (the hash's first 16 bits): tasks take ranges of them, as many as the data needs
KEYS_PER_TASK = 2_000_000  # about 160 MB of keys per task at most
KEY_SCHEMA = pa.schema([("bucket", pa.int32()), ("norm_hash", pa.string()), ("order", pa.int64()), ("id", pa.string()),
                        ("part", pa.int32()), ("bytes", pa.int64())])


def bucket_of(norm_hash: str) -> int:
    return int(norm_hash[:4], 16) % BUCKETS


def keys_table(rows: dict) -> pa.Table:
    """A partition's dedup keys, sorted by (bucket, order) for pruned reads."""
    t = pa.table({"bucket": [bucket_of(h) for h in rows["norm_hash"]], **{k: rows[k] for k in KEY_SCHEMA.names[1:]}},
                 schema=KEY_SCHEMA)
    return t.sort_by([("bucket", "ascending"), ("order", "ascending")])
