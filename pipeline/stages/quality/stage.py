"""Quality: heuristic and classifier rules, a task per partition (``pipeline.quality``,
docs/quality.md); each input entry may carry its own settings (``PrepareConfig.quality_for``)."""
from __future__ import annotations

import functools

from ... import quality as quality_rules
from ...quality import classifier as quality_classifier
from ...stats import Counts
from ..base import Context, Stage, StageResult
from .config import QualityConfig
from .tasks import STAGE, partition_task


class Quality(Stage):
    name, section, config, removes, rewrites = STAGE, "quality", QualityConfig, True, True  # rewrites: C4's dropped lines
    default = None  # absent (or null): the stage does not run

    def __init__(self, job):
        self.configs = [job.quality_for(i) for i in range(len(job.inputs))]  # each input's own settings
        for cfg in {c.classifier for c in self.configs if c.classifier is not None}:
            quality_classifier.check_label(cfg)  # a wrong model or label fails now, not in a worker

    @classmethod
    def from_job(cls, job) -> "Quality | None":
        return None if cls.section_of(job) is None else cls(job)

    def run(self, ctx: Context) -> StageResult:
        names = list(dict.fromkeys(m for c in self.configs for m in quality_rules.metric_names(c)))
        items = [{**it, "sources": {f.uri: f.input for f in t.files}}
                 for it, t in zip(ctx.per_partition(), ctx.partitions)]
        stats = ctx.runner.run(self.name, items, functools.partial(
            partition_task, configs=[c.to_dict() for c in self.configs], names=names, survivors=ctx.survivors))
        return StageResult(self.name, flow=Counts.of_tasks(stats),
                           detail={"metrics": names, "texts_shortened": sum(s["texts_shortened"] for s in stats)})
