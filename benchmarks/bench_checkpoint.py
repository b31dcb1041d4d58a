"""Two-tier checkpoints to an object store (issue 40, targets 1 and 2; numbers in docs/benchmarks/ckpt.md).

    python benchmarks/bench_checkpoint.py [--mb 256] [--saves 4] [--rounds 2] [--out /tmp/gm-bench-ckpt]

Starts the tests' local S3 server (moto on 127.0.0.1, tests/s3server.py), then:

1. **Blocked vs synchronous** (in process, a process group of one, the trainer's ``Checkpointer``):
   saves of a ``--mb`` MB state (fp32 tensors) to ``s3://``. Per save: the seconds training is blocked
   (``save()`` returns once the local write is done) and the seconds the same save takes written through
   to the store (``save()`` then ``wait()`` at once: local write, upload, commit), and as a second
   baseline DCP writing straight to the store (torch's ``FsspecWriter``, no local tier). Target:
   blocked <= 0.25 x synchronous.
2. **Whole run** (subprocesses, the tiny preset, 100 steps, a checkpoint every 10, stopped after step 50
   and resumed in a fresh run dir, as on a replacement node): checkpoint.dir on the local disk vs on S3,
   alternated ``--rounds`` times. Target: S3 adds <= 10% to the wall time. The same runs with
   ``checkpoint.every=0`` (saves at steps 50 and 100 only) split what S3 adds into a fixed part (per
   process) and a part per save.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from s3server import S3Server  # noqa: E402


def blocked_vs_sync(bucket: str, out: str, mb: int, saves: int) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from gristmill.manifests.storage import Store
    from gristmill.trainer.checkpoint import Checkpointer
    from gristmill.trainer.meta import new_meta
    from gristmill.trainer.parallelize import init_distributed

    d = init_distributed()
    n = mb * (1 << 20) // 4 // 8
    g = torch.Generator().manual_seed(0)
    state = {"model": {f"w{i}": torch.randn(n, generator=g) for i in range(8)}}
    ckpt = Checkpointer(f"{bucket}/bench/checkpoints", local_dir=os.path.join(out, "local"), keep=2, async_save=False,
                        rank=0, world_size=1, device=d.device)
    rows = []
    for step in range(1, saves + 1):
        meta = new_meta(step=step, world_size=1, global_batch=1, seq_len=1,
                        loader={"next_index": step, "seed": 0, "order": "global"}, manifest_sha256="0" * 64,
                        manifest_url="bench")
        t0 = time.perf_counter()
        blocked = ckpt.save(step, state, meta)["blocked_s"]
        ckpt.wait()
        sync = time.perf_counter() - t0
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=FsspecWriter(f"{bucket}/direct/step-{step}"))
        direct = time.perf_counter() - t0
        Store.from_url(bucket).fs.rm(f"{bucket}/direct/step-{step}", recursive=True)  # moto holds objects in memory
        rows.append({"step": step, "blocked_s": blocked, "sync_s": sync, "direct_s": direct})
        print(f"  save {step}: blocked {blocked:.3f} s, written through to S3 {sync:.3f} s, DCP straight to S3 "
              f"{direct:.3f} s", flush=True)
    rows = rows[1:] or rows  # the first save warms DCP's planner and the S3 connection
    med = {k: statistics.median(r[k] for r in rows) for k in ("blocked_s", "sync_s", "direct_s")}
    return {"mb": mb, "saves": rows, **med, "blocked_over_sync": med["blocked_s"] / med["sync_s"],
            "blocked_over_direct": med["blocked_s"] / med["direct_s"]}


def tiny_run(manifest: str, run_dir: str, ckpt_dir: str, env: dict, every: int) -> tuple[float, float]:
    """Steps 1-50, then 51-100 resumed in a fresh run dir: (wall s, child CPU s) of both processes."""
    wall = cpu = 0.0
    for part, extra in (("a", ["--stop-after-step", "50"]), ("b", [])):
        args = [sys.executable, "-m", "gristmill.trainer", os.path.join(ROOT, "configs", "train-tiny.yaml"),
                "--set", f"data.manifest={manifest}", "--set", f"run.dir={run_dir}-{part}",
                "--set", f"data.cache_dir={run_dir}-cache", "--set", "run.steps=100", "--set", f"checkpoint.every={every}",
                "--set", "eval.every=0", "--set", "run.tensorboard=false", "--set", f"checkpoint.dir={ckpt_dir}", *extra]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(args, env=env, capture_output=True, text=True)
        wall += time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise SystemExit(f"trainer failed:\n{done.stderr[-3000:]}")
        if part == "b" and "resumed from" not in done.stderr:
            raise SystemExit(f"part b did not resume:\n{done.stderr[-3000:]}")
    return wall, cpu


def whole_runs(bucket: str, out: str, rounds: int, env: dict) -> dict:
    from gristmill.manifests.synthetic import build_synthetic

    manifest = build_synthetic(os.path.join(out, "data"), dataset="count", vocab_size=64, shard_rows=(480, 480),
                               val_rows=(16,), tokens="counting").url
    # every=0 saves only at the two ends (steps 50 and 100): the difference to every=10 is the 8 saves more
    configs = [(where, every) for where in ("local", "s3") for every in (10, 0)]
    runs = {f"{w}-{e}": [] for w, e in configs}
    for r in range(rounds):
        for where, every in configs:
            name = f"{where}-{every}"
            run_dir = os.path.join(out, f"{name}-{r}")
            ckpt = os.path.join(out, f"ckpt-{name}-{r}") if where == "local" else f"{bucket}/{name}-{r}/checkpoints"
            wall, cpu = tiny_run(manifest, run_dir, ckpt, env, every)
            runs[name].append({"wall_s": wall, "cpu_s": cpu})
            print(f"  round {r} {where:<5} every {every:>2}: wall {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
    med = {n: {k: statistics.median(x[k] for x in runs[n]) for k in ("wall_s", "cpu_s")} for n in runs}
    per_save = {k: ((med["s3-10"][k] - med["s3-0"][k]) - (med["local-10"][k] - med["local-0"][k])) / 8
                for k in ("wall_s", "cpu_s")}  # what an S3 save costs more than a local one
    return {"runs": runs, "median": med, "s3_over_local_wall": med["s3-10"]["wall_s"] / med["local-10"]["wall_s"],
            "s3_over_local_cpu": med["s3-10"]["cpu_s"] / med["local-10"]["cpu_s"],
            "s3_fixed_wall_s": med["s3-0"]["wall_s"] - med["local-0"]["wall_s"],
            "s3_fixed_cpu_s": med["s3-0"]["cpu_s"] - med["local-0"]["cpu_s"], "s3_extra_per_save": per_save}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=256, help="size of the state saved in part 1 (MB of fp32)")
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="/tmp/gm-bench-ckpt")
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    server = S3Server(os.path.join(args.out, "moto.log")).start()
    try:
        os.environ.update(server.env)
        bucket = server.new_bucket()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        print(f"1. blocked vs synchronous, {args.mb} MB state, {args.saves} saves to {bucket}", flush=True)
        one = blocked_vs_sync(bucket, args.out, args.mb, args.saves)
        print(f"   median blocked {one['blocked_s']:.3f} s vs written through {one['sync_s']:.3f} s: "
              f"{one['blocked_over_sync']:.3f}x (target <= 0.25x); vs DCP straight to S3 {one['direct_s']:.3f} s: "
              f"{one['blocked_over_direct']:.3f}x", flush=True)
        print(f"2. 100-step tiny run (50 + 50 resumed in a fresh run dir), checkpoint every 10, {args.rounds} rounds",
              flush=True)
        two = whole_runs(bucket, args.out, args.rounds, env)
        print(f"   median wall s3 / local {two['s3_over_local_wall']:.3f}x (target <= 1.10x), CPU "
              f"{two['s3_over_local_cpu']:.3f}x; of it fixed (every=0, two saves: both ends): wall "
              f"{two['s3_fixed_wall_s']:+.2f} s, CPU {two['s3_fixed_cpu_s']:+.2f} s; per extra save: wall "
              f"{two['s3_extra_per_save']['wall_s']:+.3f} s, CPU {two['s3_extra_per_save']['cpu_s']:+.3f} s", flush=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"blocked_vs_sync": one, "whole_run": two}, f, indent=1)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
