"""The run dir: every path under ``<work_dir>/<run key>/`` is built here, nowhere else.

The key hashes the job's content and its input files, so a changed job or input never reuses
stale work. Layout (``part-00007`` is partition 7, ``part_name``)::

    docs/part-00007.parquet          the partition's documents (extract; later stages never rewrite it)
    keys/part-00007.parquet          its exact-dedup keys
    quarantine/part-00007.parquet    its unreadable records
    removed/<stage>/<name>.parquet   what a stage removed (REMOVED_SCHEMA); <name> is the partition's
                                     (``val-part-00007`` for decontamination's validation pass)
    overrides/<stage>/<name>.parquet texts a stage shortened or redacted (OVERRIDE_SCHEMA)
    <stage>/<kind>/<name>.<ext>      a stage's own bookkeeping (``scratch``: fuzzy dedup's bands, ...)
    tokens/part-00007.parquet        the partition's token ids
    tokenizer.json, staging/, pack_index/, report.json, quarantine.jsonl, removed.jsonl
    _done/<step>/<task>.json         a task's completion marker: written last, holds its stats
    logs/<step>/<task>.log           a task's warnings and errors; <task>.attempt-N: its batch's attempts

A task is finished iff its marker exists. A crash (even ``kill -9``) leaves at most temp files
and outputs without a marker; a rerun rewrites those, and the output is the same bytes because
every task is deterministic.
"""
from __future__ import annotations

import json
import os
import uuid

from gristmill.manifests.hashing import canonical_json
from gristmill.manifests.parquet_part import ParquetPart  # noqa: F401  (the stages' output writer)
from gristmill.manifests.shards import atomic_write


def part_name(part: int) -> str:
    return f"part-{part:05d}"


class WorkDir:
    """One run's directory. Small and picklable: tasks receive it and build their paths with it."""

    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, exist_ok=True)

    @classmethod
    def of_run(cls, work_dir: str, run_key: str) -> "WorkDir":
        """The run dir of the job whose key is ``run_key`` under the job's ``work_dir``."""
        return cls(os.path.join(work_dir, run_key))

    def __repr__(self) -> str:
        return f"WorkDir({self.root!r})"

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    # -- per-partition files ------------------------------------------------------------------
    def docs(self, part: int) -> str:
        return self._path("docs", f"{part_name(part)}.parquet")

    def keys(self, part: int) -> str:
        return self._path("keys", f"{part_name(part)}.parquet")

    def quarantine(self, part: int) -> str:
        return self._path("quarantine", f"{part_name(part)}.parquet")

    def tokens(self, part: int) -> str:
        return self._path("tokens", f"{part_name(part)}.parquet")

    def removed(self, stage: str, part: int, prefix: str = "") -> str:
        return self._path("removed", stage, f"{prefix}{part_name(part)}.parquet")

    def overrides(self, stage: str, part: int, prefix: str = "") -> str:
        return self._path("overrides", stage, f"{prefix}{part_name(part)}.parquet")

    def scratch(self, stage: str, kind: str, name: str, ext: str = "parquet") -> str:
        """A stage's own bookkeeping file: ``<stage>/<kind>/<name>.<ext>`` (``kind`` "" for none)."""
        return self._path(stage, *([kind] if kind else []), f"{name}.{ext}")

    # -- the run's single files ---------------------------------------------------------------
    @property
    def tokenizer_json(self) -> str:
        return self._path("tokenizer.json")

    @property
    def staging(self) -> str:
        return self._path("staging")

    def staged(self, rel: str) -> str:
        """A file of the dataset being built, by its path in the version (``shards/...``, ``doc_index.parquet``)."""
        return os.path.join(self.staging, rel)

    def pack_index(self, name: str) -> str:
        return self._path("pack_index", f"{name}.parquet")

    @property
    def report_json(self) -> str:
        return self._path("report.json")

    @property
    def quarantine_jsonl(self) -> str:
        return self._path("quarantine.jsonl")

    @property
    def removed_jsonl(self) -> str:
        return self._path("removed.jsonl")

    # -- task logs ----------------------------------------------------------------------------
    def logs(self, step: str) -> str:
        return self._path("logs", step)

    def log(self, step: str, name: str) -> str:
        """A task's warnings and errors (created on the first one)."""
        return self._path("logs", step, f"{name}.log")

    def attempt(self, step: str, name: str, n: int) -> str:
        """An empty file per attempt of a batch of tasks that starts with task ``name``."""
        return self._path("logs", step, f"{name}.attempt-{n}")

    # -- task markers -------------------------------------------------------------------------
    def marker(self, step: str, name: str) -> str:
        return self._path("_done", step, f"{name}.json")

    def done(self, step: str, name: str) -> dict | None:
        """The stats of a finished task, or None if it has to be (re)done."""
        try:
            with open(self.marker(step, name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def mark_done(self, step: str, name: str, stats: dict, *, sync: bool = True) -> None:
        """Commit a task: its marker, written under a unique name and renamed. ``sync`` fsyncs it,
        which also commits the task's outputs with the filesystem's journal (ext4's ordered mode);
        a batch of tasks syncs its last marker only (pipeline.runner.run_batch)."""
        if sync:
            atomic_write(self.marker(step, name), canonical_json(stats))
            return
        path = self.marker(step, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
        with open(tmp, "wb") as f:
            f.write(canonical_json(stats))
        os.replace(tmp, path)
