"""Tokenize: a task per partition (``pipeline.tokenize.tokenize_partition``); its row of the
stage table counts the documents kept (the accounting's ``kept``) and their tokens by split."""
from __future__ import annotations

import functools

from ..stats import Accounting, summed
from ..tokenize import tokenize_partition
from .base import Context, Stage, StageResult


def _task(item, tokenizer_path, cfg, split, survivors):
    return tokenize_partition(item["part"], tokenizer_path, cfg, split, survivors)


class Tokenize(Stage):
    name, section, kind = "tokenize", "tokenizer", "map"

    def run(self, ctx: Context) -> StageResult:
        job = ctx.job
        stats = ctx.runner.run(self.name, ctx.per_partition(), functools.partial(
            _task, tokenizer_path=ctx.results["tokenizer"].data["path"], cfg=job.tokenizer, split=job.split,
            survivors=ctx.survivors))
        row = summed(stats, ("documents_in", "bytes_in", "documents_out", "tokens_out", "splits"))
        row["splits"] = {s: {"documents": 0, "tokens": 0, **row.get("splits", {}).get(s, {})} for s in ("train", "validation")}
        return StageResult(self.name, rows={self.name: row}, accounting=Accounting(kept=row["documents_out"]),
                           core_seconds={self.name: sum(s["seconds"] for s in stats)},
                           peak_rss_mb={self.name: max((s.get("peak_rss_mb", 0) for s in stats), default=0)},
                           data={"tokens": {split: [s["splits"][split]["tokens"] for s in stats]
                                            for split in ("train", "validation")}})
