"""The job's tokenizer.json, or a byte-level BPE trained (in one task) on the first surviving
documents in global order (``tasks.train_bpe``)."""
from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass

from gristmill.manifests.storage import Store

from ...survivors import Survivors
from ...tokenization import load_tokenizer
from ..base import Context, Stage, StageResult
from .config import TokenizerConfig
from .tasks import train_bpe


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
    with tempfile.TemporaryDirectory() as d:  # tokenizers saves to a local file; the work dir may be a URL
        train_bpe(sample, cfg, os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer.json"), "rb") as f:
            survivors.wd.write(item["out"], f.read())
    return {"documents": len(sample)}


@dataclass(frozen=True)
class TokenizerFile:
    """What the tokenizer stage hands on: the tokenizer.json that tokenize and pack use."""

    path: str
    store: Store | None = None  # the work dir's for a trained one; None: the path's own (the job's tokenizer.path)


class Tokenizer(Stage):
    name, section, config, default = "tokenizer", "tokenizer", TokenizerConfig, TokenizerConfig()

    def __init__(self, cfg: TokenizerConfig):
        self.cfg = cfg

    def run(self, ctx: Context) -> StageResult:
        cfg = self.cfg
        if cfg.path:
            load_tokenizer(cfg.path, cfg.eos_token)  # fail now, not in a worker, if it is unusable
            return StageResult(self.name, artifact=TokenizerFile(cfg.path))
        ctx.log(f"[tokenizer] training byte-level BPE (vocab {cfg.vocab_size}) on up to {cfg.sample_bytes:,} bytes")
        ctx.runner.run(self.name, [{"name": "train", "out": ctx.wd.tokenizer_json}], functools.partial(
            train_task, cfg=cfg, survivors=ctx.survivors, parts=ctx.part_numbers()))
        return StageResult(self.name, artifact=TokenizerFile(ctx.wd.tokenizer_json, ctx.wd.store))
