"""Exact dedup (``pipeline.exact_dedup``): tasks over hash-bucket ranges of the keys extract
wrote (the text never moves), then a task per partition that collects its duplicates from the
ranges' files: ``removed/exact_dedup/part-N``."""
from __future__ import annotations

import functools

from .. import exact_dedup
from ..stats import Counts
from .base import Context, Stage, StageResult


class ExactDedup(Stage):
    name, section, kind, removes = "exact_dedup", "exact_dedup", "global", True

    def run(self, ctx: Context) -> StageResult:
        parts = [t["part"] for t in ctx.partitions]
        items = exact_dedup.plan_tasks(ctx.results["extract"].data["documents"])
        ctx.runner.run(self.name, items, functools.partial(exact_dedup.dedup_task, wd=ctx.wd, parts=parts))
        stats = ctx.runner.run(f"{self.name}.removed", ctx.per_partition(), functools.partial(
            exact_dedup.removed_task, wd=ctx.wd, tasks=[it["name"] for it in items]))
        ctx.survivors = ctx.survivors.after(self.name, removed=True)
        return StageResult(self.name, flow=Counts.of_tasks(stats), removed_files=((self.name, ""),))
