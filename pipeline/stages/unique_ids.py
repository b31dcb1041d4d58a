"""Unique ids (``pipeline.unique_ids``), for jobs whose ids come from the data (an ``id_field``):
tasks over hash-bucket ranges of the ids extract wrote, then a task per partition that collects
its rows from the ranges' files: ``removed/unique_ids/part-N``. An id that more than one input
record carries keeps none of them (docs/pipeline.md, "Document ids")."""
from __future__ import annotations

import functools

from .. import unique_ids
from ..config import PrepareConfig
from ..stats import Counts
from .base import Context, Stage, StageResult


def needs_id_check(job: PrepareConfig) -> bool:
    """Ids come from the data (some input has an id_field): check they are unique."""
    return any(spec.id_field is not None for spec in job.inputs)


class UniqueIds(Stage):
    name, section, kind, removes = "unique_ids", None, "global", True

    def run(self, ctx: Context) -> StageResult:
        parts = [t["part"] for t in ctx.partitions]
        items = unique_ids.plan_tasks(ctx.results["extract"].data["records"])
        ctx.runner.run(self.name, items, functools.partial(unique_ids.check_task, wd=ctx.wd, parts=parts))
        stats = ctx.runner.run(f"{self.name}.removed", ctx.per_partition(), functools.partial(
            unique_ids.removed_task, wd=ctx.wd, tasks=[it["name"] for it in items]))
        ctx.survivors = ctx.survivors.after(self.name, removed=True)
        return StageResult(self.name, flow=Counts.of_tasks(stats), removed_files=((self.name, ""),),
                           data={"tasks": tuple(it["name"] for it in items)})
