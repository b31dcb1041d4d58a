"""The document row every stage passes on (see docs/architecture.md), and its bookkeeping rows.

``order`` is ``part << 32 | record index``: partitions are the input files in sorted URI order,
so ``order`` follows the global input order and tells which partition a row came from without
a lookup. ``id`` is ``<file path relative to the inputs' common directory>:<position>`` (or the
user's own id field): stable, unique, and readable in an audit.
"""
from __future__ import annotations

import hashlib
import json
import math

import pyarrow as pa

from gristmill.manifests.hashing import stable_fraction  # the split rule, shared with manifest verify

from .text import normalize

PART_SHIFT = 32

DOC_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("order", pa.int64()),
    ("text", pa.string()),
    ("source", pa.string()),
    ("position", pa.int64()),
    ("lang", pa.string()),
    ("lang_score", pa.float64()),
    ("part", pa.int32()),
    ("bytes", pa.int64()),  # UTF-8 length of text, so global stages can count bytes without the text
    ("norm_hash", pa.string()),  # of pipeline.text.normalize(text): the exact-dedup key
    ("url", pa.string()),  # provenance: a WARC record's WARC-Target-URI, a jsonl/parquet record's url field; else null
])

# The order of the stages (of removed/<stage>, of ``inspect removed``, of the report's stages when
# report.json is not at hand) is ``pipeline.stages.STAGE_ORDER``, derived from ``STAGES``.
LANGUAGE = "language"  # extract's language filter: its removals are removed/language/block-B

# A removed document: its row plus why. `detail` is JSON with the stage's detail columns.
# `text`: the language filter's removals carry their text (docs/ holds only the documents it
# kept); for the stages after it the text is in docs/<part> under the same id, so it is null.
REMOVED_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("order", pa.int64()),
    ("part", pa.int32()),
    ("bytes", pa.int64()),
    ("stage", pa.string()),
    ("reason", pa.string()),
    ("detail", pa.string()),
    ("text", pa.string()),
])

# A document whose text a stage shortened (decontamination's `cut` policy): the new text.
OVERRIDE_SCHEMA = pa.schema([("id", pa.string()), ("order", pa.int64()), ("part", pa.int32()), ("text", pa.string())])

QUARANTINE_SCHEMA = pa.schema([
    ("source", pa.string()),
    ("position", pa.int64()),
    ("offset", pa.int64()),  # byte range of the record (or of a file's unreadable rest) in the uncompressed
    ("end", pa.int64()),     # stream, or of a Parquet row group in the file; null where unknown (docs/pipeline.md)
    ("part", pa.int32()),
    ("reason", pa.string()),
    ("detail", pa.string()),
    ("raw", pa.string()),  # the first bytes of the bad record, to find and fix it
])


def make_order(part: int, index: int) -> int:
    return (part << PART_SHIFT) | index


def part_of(order: int) -> int:
    return order >> PART_SHIFT


def make_id(rel_source: str, position: int) -> str:
    return f"{rel_source}:{position}"


def norm_hash(text: str) -> str:
    return hashlib.blake2b(normalize(text).encode(), digest_size=16).hexdigest()


def split_of(doc_id: str, split) -> str:
    """The split of a document (``split``: the job's SplitConfig): a function of its id alone."""
    return "validation" if stable_fraction(doc_id, split.seed) < split.validation_fraction else "train"


_CORE = ("id", "order", "part", "bytes", "reason")
_NOT_DETAIL = {"text", "source", "position", "lang", "lang_score", "norm_hash", "stage", "detail", "tokens"}


def bucket_range_tasks(total_rows: int, buckets: int, rows_per_task: int) -> list[dict]:
    """Contiguous ranges of ``buckets`` hash buckets, enough that no task holds more than
    ``rows_per_task`` rows: the tasks of a global step over per-partition files sorted by bucket."""
    n = max(1, min(buckets, math.ceil(total_rows / rows_per_task)))
    edges = [round(i * buckets / n) for i in range(n + 1)]
    return [{"name": f"task-{i:03d}", "task": i, "lo": edges[i], "hi": edges[i + 1]} for i in range(n)]


def removed_by_partition(wd, stage: str, kind: str, tasks: list[str], part: int, schema: pa.Schema, reason: str,
                         convert=lambda t: t) -> dict:
    """A global step's verdicts delivered to one partition: partition ``part``'s rows of every
    bucket-range task's file (``<stage>/<kind>/<task>.parquet``, sorted by order, so a part filter
    reads a few row groups), written as its rows of ``removed/<stage>/block-B`` (``convert`` makes them
    REMOVED_SCHEMA rows); its stats."""
    t = pa.concat_tables([wd.read_parquet(wd.scratch(stage, kind, name), filters=[("part", "=", part)], schema=schema)
                          for name in tasks]).sort_by("order") if tasks else schema.empty_table()
    out = wd.part(wd.removed(stage, part), REMOVED_SCHEMA)
    out.write(convert(t))
    out.commit()
    return {"removed": {reason: t.num_rows} if t.num_rows else {}, "removed_bytes": int(sum(t.column("bytes").to_pylist()))}


def to_removed_rows(t: pa.Table, stage: str) -> pa.Table:
    """Any stage's removed rows in the common removed schema; extra columns go to ``detail`` JSON."""
    for col in ("id", "order"):
        if col not in t.column_names:
            raise RuntimeError(f"stage {stage} returned removed rows without the {col!r} column (columns: {t.column_names})")
    n = t.num_rows
    orders = t.column("order").to_pylist()
    extra = [c for c in t.column_names if c not in _CORE and c not in _NOT_DETAIL]
    detail_cols = {c: t.column(c).to_pylist() for c in extra}
    details = [json.dumps({c: detail_cols[c][i] for c in extra}, sort_keys=True, default=str) for i in range(n)]
    return pa.table({
        "id": t.column("id"),
        "order": t.column("order").cast(pa.int64()),
        "part": t.column("part").cast(pa.int32()) if "part" in t.column_names else pa.array([part_of(o) for o in orders], pa.int32()),
        "bytes": t.column("bytes").cast(pa.int64()) if "bytes" in t.column_names else pa.nulls(n, pa.int64()),
        "stage": pa.array([stage] * n, pa.string()),
        "reason": t.column("reason").cast(pa.string()) if "reason" in t.column_names else pa.array([stage] * n, pa.string()),
        "detail": pa.array(details, pa.string()),
        "text": pa.nulls(n, pa.string()),  # in docs/<part>: see REMOVED_SCHEMA
    }, schema=REMOVED_SCHEMA)
