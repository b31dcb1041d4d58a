"""The cost of model.document_mask: training tokens/s (forward + backward) with and without it.

    flock /tmp/gristmill-heavy.lock .venv/bin/python benchmarks/bench_document_mask.py [--presets tiny small]

Rows of seq_len tokens hold documents of random lengths (mean --doc-mean tokens), the way packed
shards do; the boundaries go through the loader's own conversion (loader/documents.py). One
process, fp32, the kernel the model picks on this device (on CPU: SDPA with a dense boolean mask).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from gristmill.loader.documents import segments_to_batch
from gristmill.trainer.model import DocumentMask, Transformer, model_args


def tokens_per_s(model, tokens, positions, steps: int) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    for i in range(steps + 2):  # two warm-up steps
        if i == 2:
            t0 = time.perf_counter()
        logits = model(tokens, positions)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * tokens.numel() / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--presets", nargs="+", default=["tiny", "small"])
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--doc-mean", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    starts = rng.random((a.batch, a.seq_len)) < 1.0 / a.doc_mean
    starts[:, 0] = True
    positions = segments_to_batch(starts)["position_ids"]
    tokens = torch.from_numpy(rng.integers(1, 1024, (a.batch, a.seq_len)))
    for preset in a.presets:
        out = {"preset": preset, "seq_len": a.seq_len, "batch": a.batch, "documents_per_row": float(starts.sum(1).mean()),
               "kernel": DocumentMask.choose("sdpa", tokens.float())}
        for mask in (False, True):
            torch.manual_seed(0)
            model = Transformer(model_args(preset, 1024, a.seq_len, document_mask=mask))
            out["masked" if mask else "plain"] = tokens_per_s(model, tokens, positions if mask else None, a.steps)
        out["ratio"] = out["masked"] / out["plain"]
        print(json.dumps(out))


if __name__ == "__main__":
    main()
