"""Pack: fixed ranges of each split's token stream packed in parallel (``tasks``), then
one task merges the document index. Hands back the packed dataset as data (``Packed``); the
executor writes the manifest."""
from __future__ import annotations

import functools

from gristmill.manifests import FileRef, Shard
from gristmill.manifests.builder import DOC_INDEX_FILE

from ...handoffs import TokenCounts, TokenizerFile
from ...stats import summed
from ...tokenization import load_tokenizer
from ..base import Context, Packed, Stage, StageResult
from . import tasks as pack
from .config import PackConfig


class Pack(Stage):
    name, section, config, default = "pack", "pack", PackConfig, PackConfig()

    def __init__(self, cfg: PackConfig, eos_token: str, dataset: str):
        self.cfg, self.eos_token, self.dataset = cfg, eos_token, dataset

    @classmethod
    def from_job(cls, job) -> "Pack":
        return cls(job.pack, job.tokenizer.eos_token, job.output.dataset)

    def run(self, ctx: Context) -> StageResult:
        cfg, wd = self.cfg, ctx.wd
        tokenizer = ctx.artifact(TokenizerFile)
        _, vocab, eos_id = load_tokenizer(tokenizer.path, self.eos_token, tokenizer.store)
        if wd.local:  # an object store has no directories to make
            wd.store.makedirs(wd.staged("shards"))
        items = pack.plan_ranges(ctx.artifact(TokenCounts).by_split(), cfg.range_tokens)  # train, then validation
        out = ctx.runner.run(self.name, items, functools.partial(
            pack.pack_range_task, wd=wd, seq_len=cfg.seq_len, shard_bytes=cfg.shard_bytes, vocab_size=vocab))
        shards, slices = [], []
        for o in out:  # manifest order: the items' order
            slices.append((o["index"], len(shards)))
            shards += [Shard(**s) for s in o["shards"]]
        zero = {"documents": 0, "tokens_in": 0, "rows": 0, "shards": 0, "tokens_dropped_tail": 0}
        row = {split: summed([zero] + [o["stats"] for o in out if o["split"] == split]) for split in pack.SPLITS}
        row["tokens_in"] = sum(v["tokens_in"] for v in list(row.values()))
        row["tokens_out"] = row["tokens_in"] - sum(row[s]["tokens_dropped_tail"] for s in pack.SPLITS)
        (merged,) = ctx.runner.run(f"{self.name}.doc_index", [{"name": "merge"}], functools.partial(
            pack.merge_doc_index, wd=wd, slices=slices, out_path=wd.staged(DOC_INDEX_FILE)))
        packed = Packed(wd.staging, self.dataset, cfg.seq_len, tokenizer.path, vocab, eos_id, tuple(shards),
                        FileRef(DOC_INDEX_FILE, merged["sha256"], merged["bytes"], merged["rows"]), tokenizer.store,
                        tokenizer.encoder_label)
        return StageResult(self.name, rows={self.name: row}, dataset=packed)
