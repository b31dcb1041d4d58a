"""The version's dedup index (``pipeline.dedup_index``, format ``manifests.dedup_index``): a task per
partition writes the index rows of the documents still in the run into the staging dir; the
files are pinned in the manifest (``dedup_index``) and published with the shards, so a later run
can deduplicate against this version (``dedup_against``) without its text."""
from __future__ import annotations

import functools

from gristmill.manifests import FileRef

from .. import dedup_index as di
from ..config import FuzzyDedupConfig
from .base import Context, Stage, StageResult


class DedupIndex(Stage):
    name, kind = "dedup_index", "map"

    def run(self, ctx: Context) -> StageResult:
        cfg = ctx.job.fuzzy_dedup or FuzzyDedupConfig()  # a version without fuzzy dedup still indexes its documents
        out = ctx.runner.run(self.name, ctx.per_partition(), functools.partial(
            di.index_task, wd=ctx.wd, survivors=ctx.survivors, params=di.index_params(cfg), batch_size=cfg.batch_size))
        files = tuple(FileRef(o["path"], o["sha256"], o["bytes"], o["rows"]) for o in out if o["rows"])
        n = sum(o["rows"] for o in out)  # it removes nothing: every document in is indexed
        return StageResult(self.name, rows={self.name: {"documents_in": n, "documents_out": n, "files": len(files),
                                                        "index_bytes": sum(f.bytes for f in files)}},
                           dedup_index=files)
