"""Corpus preparation throughput, side by side in one run (numbers in docs/benchmarks.md).

    python benchmarks/bench_pipeline.py [--scales 1 10] [--out /tmp/gm-bench-pipeline]

For each corpus scale (the demo corpus, ``gristmill demo-corpus --scale N``) it runs, in a fresh
process with a fresh local Ray (2 CPUs, so every peak RSS is per run), ``prepare`` and reads
report.json:

* each stage's throughput in MB of text per core-second (summed task time);
* whole pipeline vs its slowest stage: stages are separated by barriers, so a stage's wall time
  in the run is that stage running alone on the cluster; the ratio is
  ``slowest stage wall / whole pipeline wall`` (Ray start-up and the spawning of its workers
  excluded, tokenizer training included);
* two bounds on that ratio: ``slowest / sum of stage walls`` (no time lost between stages) and
  ``slowest core-s / all stages' core-s`` (perfect streaming overlap of stages that share the
  same cores: no scheduler can beat it when every stage is CPU-bound);
* peak RSS of a Ray worker (extract, tokenize) and of the driver (pack and publish run there).

Then, on the largest corpus, the tokenize stage (``tokenize_partition``: read parquet, encode,
EOS, split, write parquet) against raw ``Tokenizer.encode_batch`` over the same documents, same
batch size, same process and threads.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))


def job_dict(corpus: str, out: str, shard_mb: int = 32) -> dict:
    c = os.path.join(corpus, "corpus")
    return {
        "inputs": [os.path.join(c, "*.jsonl*"), {"path": os.path.join(c, "*.parquet"), "text_field": "content"},
                   os.path.join(c, "*.txt"), os.path.join(c, "*.warc.gz")],
        "output": {"store": os.path.join(out, "store"), "dataset": "bench"},
        "work_dir": os.path.join(out, "work"),
        "extract": {"max_chars": 100_000},
        "split": {"validation_fraction": 0.01},
        "tokenizer": {"vocab_size": 8192, "sample_bytes": 2_000_000},
        "pack": {"seq_len": 2048, "shard_bytes": shard_mb << 20},
    }


def run_scale(scale: int, root: str, shard_mb: int) -> dict:
    import ray

    from gristmill.pipeline.config import JobConfig
    from gristmill.pipeline.demo_corpus import write_demo_corpus
    from gristmill.pipeline.executor import prepare

    corpus, out = os.path.join(root, f"corpus-{scale}"), os.path.join(root, f"run-{scale}")
    if not os.path.exists(os.path.join(corpus, "truth")):
        write_demo_corpus(corpus, scale=scale)
    shutil.rmtree(out, ignore_errors=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    warm_up_workers(ray)
    try:
        t0 = time.perf_counter()
        result = prepare(JobConfig.from_dict(job_dict(corpus, out, shard_mb)), quiet=True)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    r = result.report
    stage_wall = {s["stage"]: s.get("wall_seconds") or 0.0 for s in r["stages"]}
    stage_wall["tokenizer_training"] = json.load(open(glob.glob(os.path.join(result.run_dir, "_done", "tokenizer", "*.json"))[0]))["seconds"]
    # CPU seconds of each stage: per-partition stages from their tasks' process CPU time (all
    # threads, reading and writing included); the driver-side stages count one core for their
    # wall time (the BPE trainer and exact dedup can use more: the bound below errs high).
    def task_cpu(stage):
        return sum(json.load(open(f))["cpu_seconds"] for f in glob.glob(os.path.join(result.run_dir, "_done", stage, "*.json")))
    core_s = {k: v for k, v in stage_wall.items() if k not in ("language",)}
    core_s["extract"], core_s["tokenize"] = task_cpu("extract"), task_cpu("tokenize")
    text_mb = r["stats"]["extract"]["bytes_out"] / 1e6
    slowest = max((k for k in stage_wall if k not in ("total",)), key=lambda k: stage_wall[k])
    return {"scale": scale, "run_dir": result.run_dir, "text_mb": text_mb, "input_mb": r["stats"]["extract"]["bytes_in"] / 1e6,
            "documents": r["accounting"]["input"], "partitions": len(glob.glob(os.path.join(result.run_dir, "docs", "*.parquet"))),
            "wall_s": wall, "stage_wall_s": stage_wall, "stage_core_s": core_s, "slowest": slowest,
            "whole_vs_slowest": stage_wall[slowest] / wall,
            "bound_no_gaps": stage_wall[slowest] / sum(stage_wall.values()),
            "bound_cpu_share": max(core_s.values()) / sum(core_s.values()),
            "mb_per_core_s": {s["stage"]: s.get("mb_per_core_s") for s in r["stages"] if s.get("mb_per_core_s")},
            "peak_rss_mb_worker": r["peak_rss_mb_per_worker"],
            "peak_rss_mb_driver": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def warm_up_workers(ray) -> None:
    """Start the Ray workers and Ray Data before the clock: a fresh local Ray's first job spends
    about 1.5 s here spawning them, which would otherwise be billed to the first stage."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ray.data.from_items([{"i": i} for i in range(2)], override_num_blocks=2).map(lambda r: r, num_cpus=1).materialize()


def tokenize_vs_raw(run_dir: str, root: str) -> dict:
    """The tokenize stage vs raw encode_batch on the same documents, batch size and threads."""
    from gristmill.pipeline.config import SplitConfig, TokenizerConfig
    from gristmill.pipeline.tokenize import load_tokenizer, tokenize_partition

    cfg = TokenizerConfig(batch_size=512)
    tok_path = os.path.join(run_dir, "tokenizer.json")
    tok, _, _ = load_tokenizer(tok_path, cfg.eos_token)
    docs = sorted(glob.glob(os.path.join(run_dir, "docs", "*.parquet")))
    texts = [t for f in docs for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    results = {}
    for attempt in range(2):  # interleaved, best of two: the machine is shared
        t0 = time.perf_counter()
        for i in range(0, len(texts), cfg.batch_size):
            tok.encode_batch(texts[i: i + cfg.batch_size], add_special_tokens=False)
        raw = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(0, len(texts), cfg.batch_size):
            tok.encode_batch_fast(texts[i: i + cfg.batch_size], add_special_tokens=False)
        raw_fast = time.perf_counter() - t0
        work = os.path.join(root, f"tok-stage-{attempt}")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(os.path.join(work, "docs"))
        for f in docs:
            os.symlink(f, os.path.join(work, "docs", os.path.basename(f)))
        t0 = time.perf_counter()
        for f in docs:
            part = int(os.path.basename(f).split("-")[1].split(".")[0])
            tokenize_partition(part, tok_path, cfg, SplitConfig(), work, [])
        stage = time.perf_counter() - t0
        for k, v in (("raw_encode_batch_s", raw), ("raw_encode_batch_fast_s", raw_fast), ("stage_s", stage)):
            results[k] = min(results.get(k, v), v)
    return {"text_mb": mb, "documents": len(texts), **results,
            "raw_mb_s": mb / results["raw_encode_batch_s"], "raw_fast_mb_s": mb / results["raw_encode_batch_fast_s"],
            "stage_mb_s": mb / results["stage_s"], "stage_vs_raw": results["raw_encode_batch_s"] / results["stage_s"],
            "stage_vs_raw_fast": results["raw_encode_batch_fast_s"] / results["stage_s"],
            "threads": os.environ.get("RAYON_NUM_THREADS", f"default ({os.cpu_count()} cores)")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--out", default="/tmp/gm-bench-pipeline")
    ap.add_argument("--only-tokenize", metavar="RUN_DIR", help="only the tokenize comparison, on a finished run dir")
    ap.add_argument("--shard-mb", type=int, default=32, help="pack.shard_bytes in MiB; the driver holds one shard while packing")
    ap.add_argument("--scale-only", type=int, help=argparse.SUPPRESS)  # one scale, JSON on stdout (run by main)
    args = ap.parse_args()
    if args.only_tokenize:
        print(json.dumps(tokenize_vs_raw(args.only_tokenize, args.out), indent=1))
        return 0
    os.makedirs(args.out, exist_ok=True)
    if args.scale_only is not None:
        print(json.dumps(run_scale(args.scale_only, args.out, args.shard_mb)))
        return 0
    runs = []
    for scale in args.scales:  # a process per scale: peak RSS is a high-water mark
        proc = subprocess.run([sys.executable, __file__, "--scale-only", str(scale), "--out", args.out,
                               "--shard-mb", str(args.shard_mb)],
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    tok = tokenize_vs_raw(runs[-1]["run_dir"], args.out)
    print(json.dumps({"runs": runs, "tokenize_vs_raw": tok}, indent=1))
    print()
    print(f"{'scale':>5} {'docs':>7} {'parts':>5} {'text MB':>8} {'wall s':>7} {'slowest stage':>20} {'whole/slowest':>14} "
          f"{'bound: no gaps':>15} {'bound: CPU share':>17} {'RSS worker MB (extract/tokenize)':>34} {'RSS driver MB':>14}")
    for r in runs:
        w, slow = r["peak_rss_mb_worker"], f"{r['slowest']} {r['stage_wall_s'][r['slowest']]:.1f}s"
        print(f"{r['scale']:>5} {r['documents']:>7,} {r['partitions']:>5} {r['text_mb']:>8.1f} {r['wall_s']:>7.1f} {slow:>20} "
              f"{r['whole_vs_slowest']:>14.2f} {r['bound_no_gaps']:>15.2f} {r['bound_cpu_share']:>17.2f} "
              f"{w['extract']:>16.0f} / {w['tokenize']:<15.0f} {r['peak_rss_mb_driver']:>14.0f}")
        print(f"      stage wall s {({k: round(v, 2) for k, v in r['stage_wall_s'].items()})}")
        print(f"      stage core s {({k: round(v, 2) for k, v in r['stage_core_s'].items()})}")
    print("MB/s per core by stage (largest scale):", {k: round(v, 2) for k, v in runs[-1]["mb_per_core_s"].items()})
    print(f"tokenize stage {tok['stage_mb_s']:.2f} MB/s vs raw encode_batch {tok['raw_mb_s']:.2f} MB/s: "
          f"{tok['stage_vs_raw']:.2f}x (vs encode_batch_fast {tok['raw_fast_mb_s']:.2f} MB/s: {tok['stage_vs_raw_fast']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    sys.exit(main())
