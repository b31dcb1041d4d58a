"""PII: placeholders for e-mails, IPs and phone numbers (``tasks``), a task per partition.
It removes nothing (``removes = False``); it rewrites texts, so it has its row in the document
flow, and its replacement counts are part of the published statistics."""
from __future__ import annotations

import functools

from ...stats import Counts
from ..base import Context, Stage, StageResult
from . import tasks as pii
from .config import PiiConfig


class Pii(Stage):
    name, section, config, rewrites = pii.STAGE, "pii", PiiConfig, True  # removes nothing
    default = PiiConfig()

    def __init__(self, cfg: PiiConfig):
        self.cfg = cfg

    def run(self, ctx: Context) -> StageResult:
        stats = ctx.runner.run(self.name, ctx.per_partition(),
                               functools.partial(pii.pii_task, cfg=self.cfg, survivors=ctx.survivors))
        counts = {k: sum(s["replacements"][k] for s in stats) for k in pii.KINDS}
        kinds = [k for k, on in zip(pii.KINDS, (self.cfg.emails, self.cfg.ips, self.cfg.phones)) if on]
        return StageResult(self.name, flow=Counts(), detail={
            "replacements": {k: counts[k] for k in kinds}, "documents_changed": sum(s["documents_changed"] for s in stats)})
