"""A published dataset of random tokens, for throughput benchmarks (deploy/gpu-benchmark.sh,
benchmarks/bench_trainer.py): the step costs the same whatever the tokens are."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from gristmill.manifests import DatasetBuilder, Input, ManifestStore


def build_synthetic(root: str, *, vocab_size: int, seq_len: int, train_rows: int, val_rows: int = 64,
                    seed: int = 0) -> str:
    """Write and publish ``<root>/store/synthetic``; returns the version URL."""
    from tokenizers import Tokenizer, models

    os.makedirs(root, exist_ok=True)
    tok = os.path.join(root, "tokenizer.json")
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0")).save(tok)
    b = DatasetBuilder(os.path.join(root, "staging"), dataset="synthetic", seq_len=seq_len, tokenizer_json=tok,
                       vocab_size=vocab_size, eos_id=0)
    rng = np.random.default_rng(seed)
    doc = {k: [] for k in ("shard", "row", "start", "length", "doc_id", "source", "position", "lang")}
    for split, n in (("train", train_rows), ("validation", val_rows)):
        shard = len(b.shards)
        b.add_shard(split, rng.integers(1, vocab_size, size=(n, seq_len + 1), dtype=np.int64))
        for r in range(n):
            for k, v in zip(doc, (shard, r, 0, seq_len + 1, f"syn-{shard}-{r}", "synthetic://", r, "xx")):
                doc[k].append(v)
    b.set_doc_index(pa.table(doc))
    m = b.manifest(inputs=[Input("synthetic://", 0, "0" * 64)], config={"synthetic": True, "seed": seed},
                   code_version="synthetic", stats={})
    return ManifestStore(os.path.join(root, "store")).publish(m, b.dir).url
