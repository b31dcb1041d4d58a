"""CPU sanity throughput of the bundled trainer, side by side in one run (ratios, not absolutes:
the machine is shared and noisy).

    PYTHONPATH=. python benchmarks/bench_trainer.py [--steps 20]

One process, one thread (on a shared, oversubscribed VM OpenMP's spinning threads make a
multi-threaded step many times slower and the numbers meaningless), gloo, fp32, synthetic
tokens (vocab 512, seq_len 128, global batch 8). Rows:
the tiny preset with activation checkpointing none / selective / full, and the small preset;
then a checkpoint of the small preset, synchronous vs asynchronous (seconds training was
blocked). Tokens/s is the median over the steps after the first 5.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from gristmill.trainer import config
from gristmill.manifests.synthetic import build_synthetic
from gristmill.trainer.train import train

WARMUP = 5


def run(url: str, root: str, name: str, steps: int, **sections) -> list[dict]:
    raw = {"run": {"dir": os.path.join(root, name), "steps": steps, "tensorboard": False},
           "data": {"manifest": url, "global_batch": 8, "cache_dir": os.path.join(root, "cache")},
           "model": {"preset": "tiny"}, "parallelism": {"mixed_precision": "fp32", "attention": "sdpa"},
           "optimizer": {"warmup_steps": 2}, "checkpoint": {"enabled": False}}
    for section, values in sections.items():
        raw[section] = {**raw.get(section, {}), **values}
    train(config.TrainConfig.from_dict(raw, where=f"bench:{name}"))
    with open(os.path.join(root, name, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def tokens_per_s(records: list[dict]) -> float:
    return statistics.median(r["tokens_per_s"] for r in records if r["kind"] == "train" and r["step"] > WARMUP)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="bench-trainer-")
    url = build_synthetic(os.path.join(root, "data"), vocab_size=512, seq_len=128, shard_rows=(512,), val_rows=(64,),
                          tokens="random").url
    t0 = time.perf_counter()
    rows = []
    for name, model, ac in (("tiny", "tiny", "none"), ("tiny-selective", "tiny", "selective"),
                            ("tiny-full", "tiny", "full"), ("small", "small", "none")):
        tps = tokens_per_s(run(url, root, name, args.steps, model={"preset": model},
                               parallelism={"activation_checkpoint": ac}))
        rows.append((name, ac, tps))
    base = rows[0][2]
    print(f"{'run':<16} {'act. ckpt':<10} {'tokens/s':>10} {'vs tiny':>8}")
    for name, ac, tps in rows:
        print(f"{name:<16} {ac:<10} {tps:>10,.0f} {tps / base:>7.2f}x")

    saves = {}
    for mode in ("sync", "async"):
        recs = run(url, root, f"small-save-{mode}", 4, model={"preset": "small"},
                   checkpoint={"enabled": True, "every": 2, "async_save": mode == "async", "resume": False})
        # The first save: later ones may also wait for the previous async write on so short a run.
        saves[mode] = next(r["blocked_s"] for r in recs if r["kind"] == "checkpoint")
    print(f"checkpoint of the small preset: training blocked {saves['sync']:.3f} s sync, {saves['async']:.3f} s async "
          f"({saves['sync'] / saves['async']:.1f}x less blocking)")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
