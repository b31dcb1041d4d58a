"""Issue 40 target 3: tokens/s of the tiny preset on CPU with ``log_every: 10`` against the trainer
of an older tree (``--base``: a checkout, e.g. ``git worktree add --detach /tmp/base <commit>``)
at ``log_every: 1``, side by side in one run, interleaved (the machine is shared and noisy).

    PYTHONPATH=. python benchmarks/bench_ranks.py --base /tmp/base [--steps 60] [--rounds 3] [--nproc 1 2]

Each row trains ``--steps`` steps from scratch (checkpoints off, eval off) in a fresh process,
one thread per process, and measures ``Trainer.train()`` alone (the model build and the process
group's start are left out): tokens/s = steps x global batch x seq_len / its wall time, and the
CPU seconds it took (all ranks summed). ``--nproc 2`` runs two ranks under torchrun (gloo).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"gristmill": "gristmill", "gristmill.loader": "loader", "gristmill.trainer": "trainer",
            "gristmill.manifests": "manifests", "gristmill.pipeline": "pipeline", "gristmill.audit": "audit"}


def use_tree(tree: str) -> None:
    """Import gristmill from ``tree`` (its folders mapped as pyproject.toml maps them), ahead of
    the editable install's finder."""
    from importlib.machinery import PathFinder

    class Finder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname in PACKAGES:
                folder = os.path.join(tree, PACKAGES[fullname])
                return PathFinder.find_spec(fullname, [os.path.dirname(folder)]) if fullname == "gristmill" else \
                    _package_spec(fullname, folder)
            return None

    sys.meta_path.insert(0, Finder)


def _package_spec(fullname: str, folder: str):
    from importlib.util import spec_from_file_location

    return spec_from_file_location(fullname, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])


def worker(args) -> None:
    """One run (one rank under torchrun): times Trainer.train() and writes a JSON line per rank."""
    use_tree(args.tree)
    import torch

    torch.set_num_threads(1)
    from gristmill.trainer import config
    from gristmill.trainer.train import Trainer

    raw = {"run": {"dir": args.run_dir, "steps": args.steps, "tensorboard": False, "log_every": args.log_every},
           "data": {"manifest": args.url, "global_batch": 8, "cache_dir": args.run_dir + "-cache"},
           "model": {"preset": "tiny"}, "parallelism": {"mixed_precision": "fp32", "attention": "sdpa"},
           "optimizer": {"warmup_steps": 2}, "checkpoint": {"enabled": False}, "eval": {"every": 0}}
    cfg = config.TrainConfig.from_dict(raw, where="bench_ranks")
    with Trainer(cfg) as trainer:
        cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        trainer.train()
        wall, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        tokens = args.steps * trainer.global_batch * trainer.seq_len
        rank = trainer.dist.rank
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    with open(args.out, "a") as f:
        f.write(json.dumps({"rank": rank, "wall_s": wall, "cpu_s": cpu, "tokens": tokens}) + "\n")


def one_run(tree: str, url: str, root: str, name: str, steps: int, log_every: int, nproc: int) -> dict:
    out = os.path.join(root, name + ".jsonl")
    me = [os.path.abspath(__file__), "--worker", "--tree", tree, "--url", url, "--run-dir", os.path.join(root, name),
          "--steps", str(steps), "--log-every", str(log_every), "--out", out]
    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc_per_node={nproc}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(launch + me, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rows = [json.loads(line) for line in open(out)]
    wall = max(r["wall_s"] for r in rows)
    return {"tokens_per_s": rows[0]["tokens"] / wall, "cpu_s": sum(r["cpu_s"] for r in rows)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--tree", default=ROOT)
    p.add_argument("--base", help="the older tree to compare with (its log_every: 1)")
    p.add_argument("--url")
    p.add_argument("--run-dir")
    p.add_argument("--out")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()
    if args.worker:
        return worker(args)
    use_tree(ROOT)
    from gristmill.manifests.synthetic import build_synthetic

    root = tempfile.mkdtemp(prefix="bench-ranks-")
    url = build_synthetic(os.path.join(root, "data"), vocab_size=512, seq_len=128, shard_rows=(512,) * 4,
                          val_rows=(64,), tokens="random").url
    rows = [("base log_every 1", args.base, 1), ("new log_every 1", ROOT, 1), ("new log_every 10", ROOT, 10)]
    for nproc in args.nproc:
        results: dict[str, list[dict]] = {name: [] for name, _, _ in rows}
        for rnd in range(args.rounds):  # interleaved: each round runs every row once
            for name, tree, every in rows:
                results[name].append(one_run(tree, url, root, f"{nproc}-{rnd}-{name.replace(' ', '-')}", args.steps,
                                             every, nproc))
        base = statistics.median(r["tokens_per_s"] for r in results[rows[0][0]])
        base_cpu = statistics.median(r["cpu_s"] for r in results[rows[0][0]])
        print(f"\n{nproc} process(es), tiny preset, {args.steps} steps x 8 x 128 tokens, {args.rounds} rounds interleaved")
        print(f"{'row':<20} {'tokens/s (median)':>18} {'x base':>7} {'CPU s (median)':>15} {'x base':>7}  all tokens/s")
        for name, _, _ in rows:
            tps = statistics.median(r["tokens_per_s"] for r in results[name])
            cpu = statistics.median(r["cpu_s"] for r in results[name])
            every = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in results[name])
            print(f"{name:<20} {tps:>18,.0f} {tps / base:>7.2f} {cpu:>15.2f} {cpu / base_cpu:>7.2f}  {every}")


if __name__ == "__main__":
    main()
