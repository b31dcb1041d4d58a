"""The job's tokenizer.json, or a byte-level BPE trained (in one task) on the first surviving
documents in global order (``tasks.train_bpe``)."""
from __future__ import annotations

import functools
import os
import tempfile

from gristmill.manifests.storage import Store

from ...survivors import Survivors
from ...handoffs import TokenizerFile
from ...tokenization import choose_encoder
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


class Tokenizer(Stage):
    name, section, config, default = "tokenizer", "tokenizer", TokenizerConfig, TokenizerConfig()

    def __init__(self, cfg: TokenizerConfig):
        self.cfg = cfg

    def run(self, ctx: Context) -> StageResult:
        cfg = self.cfg
        if cfg.path:  # choose_encoder loads it: fail now, not in a worker, if it is unusable
            return StageResult(self.name, artifact=self._chosen(ctx, cfg.path, None))
        ctx.log(f"[tokenizer] training byte-level BPE (vocab {cfg.vocab_size}) on up to {cfg.sample_bytes:,} bytes")
        ctx.runner.run(self.name, [{"name": "train", "out": ctx.wd.tokenizer_json}], functools.partial(
            train_task, cfg=cfg, survivors=ctx.survivors, parts=ctx.part_numbers()))
        return StageResult(self.name, artifact=self._chosen(ctx, ctx.wd.tokenizer_json, ctx.wd.store))

    def _chosen(self, ctx: Context, path: str, store: Store | None) -> TokenizerFile:
        encoder, why_not = choose_encoder(path, self.cfg.eos_token, store, self.cfg.encoder)
        if why_not:  # the one line a fallback costs: tokenize runs at HF tokenizers' speed
            ctx.log(f"[tokenizer] encoding with tokenizers, not tiktoken: {why_not}")
        return TokenizerFile(path, store, encoder)
