"""The work dir: resumable stage outputs, committed atomically per partition.

Layout under ``<work_dir>/<run key>/`` (the key hashes the job's content and its input files,
so a changed job or input never reuses stale work)::

    <stage>/part-00007.parquet   the partition's output (written to a temp name, then renamed)
    _done/<stage>/part-00007.json  the completion marker: written last, holds the stats

A partition is finished iff its marker exists. A crash (even ``kill -9``) leaves at most temp
files and outputs without a marker; a rerun rewrites those, and the output is the same bytes
because every stage is deterministic.
"""
from __future__ import annotations

import json
import os

from gristmill.manifests.hashing import canonical_json
from gristmill.manifests.parquet_part import ParquetPart  # noqa: F401  (the stages' output writer)
from gristmill.manifests.shards import atomic_write


def part_name(part: int) -> str:
    return f"part-{part:05d}"


class WorkDir:
    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, exist_ok=True)

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def marker(self, stage: str, name: str) -> str:
        return self.path("_done", stage, f"{name}.json")

    def done(self, stage: str, name: str) -> dict | None:
        """The stats of a finished unit of work, or None if it has to be (re)done."""
        try:
            with open(self.marker(stage, name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def mark_done(self, stage: str, name: str, stats: dict) -> None:
        atomic_write(self.marker(stage, name), canonical_json(stats))
