"""The version's dedup index (``pipeline.dedup_index``, format ``manifests.dedup_index``): a task per
partition computes the index rows of the documents still in the run, tagged with a hash of their
id; then a task per published file (as many as the row count needs, never the partition count)
takes a range of that hash from every partition, sorted by document id, into the staging dir. The
files are pinned in the manifest (``dedup_index``) and published with the shards, so a later run
can deduplicate against this version (``dedup_against``) without its text; the same documents
give the same files and hashes whatever the partitioning."""
from __future__ import annotations

import functools

from gristmill.manifests import FileRef

from ... import dedup_index as di
from ...fuzzy_config import FuzzyDedupConfig
from ..base import Context, Stage, StageResult


class DedupIndex(Stage):
    name = di.STAGE  # no section of its own: every version publishes its dedup index

    def __init__(self, fuzzy: FuzzyDedupConfig | None = None):
        self.fuzzy = fuzzy or FuzzyDedupConfig()  # a version without fuzzy dedup still indexes its documents

    @classmethod
    def from_job(cls, job) -> "DedupIndex":
        return cls(job.fuzzy_dedup)

    def run(self, ctx: Context) -> StageResult:
        cfg = self.fuzzy
        params = di.index_params(cfg)
        parts = ctx.per_partition()
        rows = ctx.runner.run(self.name, parts, functools.partial(
            di.index_task, wd=ctx.wd, survivors=ctx.survivors, params=params, batch_size=cfg.batch_size))
        n = sum(r["rows"] for r in rows)  # it removes nothing: every document in is indexed
        out = ctx.runner.run(f"{self.name}.merge", di.plan_files(n), functools.partial(
            di.merge_task, wd=ctx.wd, params=params,
            files=ctx.wd.whole_files([ctx.wd.part_scratch(di.INDEX_DIR, "parts", p["part"]) for p in parts])))
        files = tuple(FileRef(o["path"], o["sha256"], o["bytes"], o["rows"]) for o in out)
        return StageResult(self.name, rows={self.name: {"documents_in": n, "documents_out": n, "files": len(files),
                                                        "index_bytes": sum(f.bytes for f in files)}},
                           dedup_index=files)
