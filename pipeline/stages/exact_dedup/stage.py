"""Exact dedup (its ``tasks``): tasks over hash-bucket ranges of the keys extract
wrote (the text never moves), then a task per partition that collects its duplicates from the
ranges' files: its rows of ``removed/exact_dedup/block-B``."""
from __future__ import annotations

import functools

from ...stats import Counts
from ...handoffs import Extracted, RepeatedIds
from ..base import Context, Stage, StageResult
from . import tasks as exact_dedup
from .config import ExactDedupConfig


class ExactDedup(Stage):
    name, section, config, removes = exact_dedup.STAGE, "exact_dedup", ExactDedupConfig, True
    default = ExactDedupConfig()

    def __init__(self, cfg: ExactDedupConfig):
        self.cfg = cfg

    def run(self, ctx: Context) -> StageResult:
        items = exact_dedup.plan_tasks(ctx.artifact(Extracted).documents)
        repeated = ctx.artifacts.get(RepeatedIds)  # a job without id_field has no repeated ids
        ctx.runner.run(self.name, items, functools.partial(exact_dedup.dedup_task, wd=ctx.wd, parts=ctx.part_numbers(),
                                                           exclude_tasks=repeated.tasks if repeated else ()))
        stats = ctx.runner.run(f"{self.name}.removed", ctx.per_partition(), functools.partial(
            exact_dedup.removed_task, wd=ctx.wd, tasks=[it["name"] for it in items]))
        return StageResult(self.name, flow=Counts.of_tasks(stats))
