"""Tokenize: a task per partition (``tasks.tokenize_partition``); its row of the
stage table counts the documents kept (the accounting's ``kept``) and their tokens by split."""
from __future__ import annotations

import functools

from ...handoffs import SPLITS, TokenCounts, TokenizerFile
from ...stats import Accounting, summed
from ...tokenizer_config import TokenizerConfig
from ..base import Context, JobSection, Stage, StageResult
from . import tasks
from .config import SplitConfig


def _task(item, tokenizer, cfg, split, survivors):
    return tasks.tokenize_partition(item["part"], tokenizer.path, cfg, split, survivors, tokenizer.store, tokenizer.encoder)


class Tokenize(Stage):
    name, section, config, default = tasks.STAGE, "split", SplitConfig, SplitConfig()  # which documents are validation
    more_sections = (JobSection("tokenizer", TokenizerConfig, TokenizerConfig()),)  # the tokenizer stage's too

    def __init__(self, cfg: TokenizerConfig, split: SplitConfig):
        self.cfg, self.split = cfg, split

    @classmethod
    def from_job(cls, job) -> "Tokenize":
        return cls(job.tokenizer, job.split)

    def run(self, ctx: Context) -> StageResult:
        stats = ctx.runner.run(self.name, ctx.per_partition(), functools.partial(
            _task, tokenizer=ctx.artifact(TokenizerFile), cfg=self.cfg, split=self.split,
            survivors=ctx.survivors))
        row = summed(stats, ("documents_in", "bytes_in", "documents_out", "tokens_out", "splits"))
        row["splits"] = {s: {"documents": 0, "tokens": 0, **row.get("splits", {}).get(s, {})} for s in SPLITS}
        return StageResult(self.name, rows={self.name: row}, accounting=Accounting(kept=row["documents_out"]),
                           core_seconds={self.name: sum(s["seconds"] for s in stats)},
                           peak_rss_mb={self.name: max((s.get("peak_rss_mb", 0) for s in stats), default=0)},
                           artifact=TokenCounts(*(tuple(s["splits"][split]["tokens"] for s in stats) for split in SPLITS)))
