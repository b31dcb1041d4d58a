"""Unique ids (``tasks``), for jobs whose ids come from the data (an ``id_field``):
tasks over hash-bucket ranges of the ids extract wrote, then a task per partition that collects
its rows from the ranges' files: its rows of ``removed/unique_ids/block-B``. An id that more than one input
record carries keeps none of them (docs/pipeline.md, "Document ids")."""
from __future__ import annotations

import functools
from ...handoffs import Extracted, RepeatedIds
from ...stats import Counts
from ..base import Context, Stage, StageResult
from . import tasks as unique_ids
from .tasks import needs_id_check


class UniqueIds(Stage):
    name, removes = unique_ids.STAGE, True  # no section of its own: on when an input has an id_field

    @classmethod
    def from_job(cls, job) -> "UniqueIds | None":
        return cls() if needs_id_check(job) else None

    def run(self, ctx: Context) -> StageResult:
        items = unique_ids.plan_tasks(ctx.artifact(Extracted).records)
        ctx.runner.run(self.name, items, functools.partial(unique_ids.check_task, wd=ctx.wd, parts=ctx.part_numbers()))
        stats = ctx.runner.run(f"{self.name}.removed", ctx.per_partition(), functools.partial(
            unique_ids.removed_task, wd=ctx.wd, tasks=[it["name"] for it in items]))
        return StageResult(self.name, flow=Counts.of_tasks(stats), artifact=RepeatedIds(tuple(it["name"] for it in items)))
