"""The job's tokenizer.json, or a byte-level BPE trained (in one task) on the first surviving
documents in global order (``pipeline.tokenize.train_bpe``)."""
from __future__ import annotations

import functools
import os
import uuid

from ..survivors import Survivors
from ..tokenize import load_tokenizer, train_bpe
from .base import Context, Stage, StageResult


def sample_texts(survivors: Survivors, parts: list[int], budget: int):
    """The first surviving documents in global order, up to ``budget`` bytes."""
    for part in parts:
        for t in survivors.docs(part, ["id", "text", "bytes"], 1024):
            for text, n in zip(t.column("text").to_pylist(), t.column("bytes").to_pylist()):
                if budget <= 0:
                    return
                yield text
                budget -= n


def train_task(item: dict, cfg, survivors: Survivors, parts: list[int]) -> dict:
    sample = list(sample_texts(survivors, parts, cfg.sample_bytes))
    tmp = f"{item['out']}.tmp-{uuid.uuid4().hex[:12]}.json"  # unique: an attempt never writes over another's
    train_bpe(sample, cfg, tmp)
    os.replace(tmp, item["out"])
    return {"documents": len(sample)}


class Tokenizer(Stage):
    name, section, kind = "tokenizer", "tokenizer", "global"

    def run(self, ctx: Context) -> StageResult:
        cfg = ctx.job.tokenizer
        if cfg.path:
            load_tokenizer(cfg.path, cfg.eos_token)  # fail now, not in a worker, if it is unusable
            return StageResult(self.name, data={"path": cfg.path})
        ctx.log(f"[tokenizer] training byte-level BPE (vocab {cfg.vocab_size}) on up to {cfg.sample_bytes:,} bytes")
        ctx.runner.run(self.name, [{"name": "train", "out": ctx.wd.tokenizer_json}], functools.partial(
            train_task, cfg=cfg, survivors=ctx.survivors, parts=[t["part"] for t in ctx.partitions]))
        return StageResult(self.name, data={"path": ctx.wd.tokenizer_json})
