"""The documents still in the run: a partition's document file less what global stages removed,
with the texts they shortened. Global stages write their removals (REMOVED_SCHEMA) and text
overrides (OVERRIDE_SCHEMA) as files sorted by ``order``, so a partition's reader prunes to its
own rows: memory is one partition's removals, never the corpus'.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq


def removed_ids(files: list[str], part: int) -> set[str]:
    """Ids a global stage removed from this partition (the files are sorted by order, so the
    part filter skips most row groups: memory is one partition's removals, not the corpus')."""
    ids: set[str] = set()
    for f in files:
        t = pq.read_table(f, columns=["id"], filters=[("part", "=", part)])
        ids.update(t.column("id").to_pylist())
    return ids


def overridden_texts(files: list[str], part: int) -> dict[str, str]:
    """id -> text for the documents of this partition that a stage shortened (decontam `cut`)."""
    out: dict[str, str] = {}
    for f in files:
        t = pq.read_table(f, columns=["id", "text"], filters=[("part", "=", part)])
        out.update(zip(t.column("id").to_pylist(), t.column("text").to_pylist()))
    return out


def surviving_docs(docs_file: str, part: int, removed_files: list[str], override_files: list[str], columns: list[str],
                   batch_size: int):
    """Batches (pa.Table) of partition ``part``'s documents that no stage removed, in order, with
    overridden texts applied (when ``text`` is among ``columns``)."""
    drop = removed_ids(removed_files, part)
    new_text = overridden_texts(override_files, part) if "text" in columns else {}
    for batch in pq.ParquetFile(docs_file).iter_batches(columns=columns, batch_size=batch_size):
        t = pa.Table.from_batches([batch])
        if drop:
            t = t.filter(pa.array([i not in drop for i in t.column("id").to_pylist()], pa.bool_()))
        if new_text and t.num_rows:
            texts = [new_text.get(i, x) for i, x in zip(t.column("id").to_pylist(), t.column("text").to_pylist())]
            t = t.set_column(t.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
        if t.num_rows:
            yield t
