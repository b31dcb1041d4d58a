"""Corpus preparation throughput, side by side in one run (numbers in docs/benchmarks.md).

    python benchmarks/bench_pipeline.py [--scales 1 10] [--num-cpus 2] [--out /tmp/gm-bench-pipeline]
    python benchmarks/bench_pipeline.py --job examples/demo-job-full.yaml --scales 10 30 --num-cpus 1 2

For each corpus scale (the demo corpus, ``gristmill demo-corpus --scale N``) and each CPU count
it runs, in a fresh process with a fresh local Ray (``--num-cpus``, 2 by default, so every peak
RSS is per run), ``prepare`` and reads report.json. The job is the built-in one below, or
``--job FILE``: a job file like examples/demo-job-full.yaml (every stage, fuzzy dedup and
decontamination included) whose ``../demo-out`` paths are pointed at the scale's corpus and
whose work dir and store are the run's own. It reports:

* each stage's throughput in MB of text per core-second (summed task time);
* whole pipeline vs its slowest stage: stages are separated by barriers, so a stage's wall time
  in the run is that stage running alone on the cluster; the ratio is
  ``slowest stage wall / whole pipeline wall`` (Ray start-up and the spawning of its workers
  excluded, tokenizer training included);
* two bounds on that ratio: ``slowest / sum of stage walls`` (no time lost between stages) and
  ``slowest core-s / all stages' core-s`` (perfect streaming overlap of stages that share the
  same cores: no scheduler can beat it when every stage is CPU-bound);
* each stage's wall time over extract's (``fuzzy_dedup / extract``, ``decontaminate / extract``);
* peak RSS of a Ray worker: extract and tokenize from report.json, and of any Ray worker
  process of the run (every stage's tasks), sampled every 50 ms; and of the driver.

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


def job_from_file(path: str, corpus: str, out: str, num_cpus: int) -> dict:
    """A job file like examples/demo-job-full.yaml on this scale's corpus: its ``../demo-out``
    (the demo corpus next to the repo) becomes ``corpus``; work dir and store are the run's."""
    import yaml

    with open(path) as f:
        text = f.read().replace("../demo-out", os.path.abspath(corpus))
    job = yaml.safe_load(text)
    job["work_dir"] = os.path.abspath(os.path.join(out, "work"))
    job["output"] = {**job["output"], "store": os.path.abspath(os.path.join(out, "store"))}
    job["runner"] = {**(job.get("runner") or {}), "num_cpus": num_cpus}
    return job


def run_scale(scale: int, root: str, shard_mb: int, num_cpus: int = 2, job_file: str | None = None) -> dict:
    import ray

    from bench_minhash import PeakWorkerRSS
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.demo_corpus import write_demo_corpus
    from gristmill.pipeline.executor import prepare

    corpus, out = os.path.join(root, f"corpus-{scale}"), os.path.join(root, f"run-{scale}-{num_cpus}cpu")
    if not os.path.exists(os.path.join(corpus, "truth")):
        write_demo_corpus(corpus, scale=scale)
    shutil.rmtree(out, ignore_errors=True)  # a fresh work dir: a resumed run would skip the work we time
    job = job_from_file(job_file, corpus, out, num_cpus) if job_file else job_dict(corpus, out, shard_mb)
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    warm_up_workers(ray, num_cpus)
    try:
        with PeakWorkerRSS() as mem:
            t0 = time.perf_counter()
            result = prepare(PrepareConfig.from_dict(job, base_dir=os.path.dirname(os.path.abspath(job_file or "."))),
                             quiet=True)
            wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    r = result.report
    stage_wall = {s["stage"]: s.get("wall_seconds") or 0.0 for s in r["stages"]}
    stage_wall["tokenizer_training"] = marker(result.run_dir, "tokenizer", "train")["_seconds"]
    # CPU seconds of each stage: per-partition stages from their tasks' process CPU time (all
    # threads, reading and writing included); the others from report.json (their tasks' CPU
    # time plus the driver's), tokenizer training from its task's marker.
    from gristmill.pipeline.workdir import WorkDir

    def task_cpu(stage):
        return sum(s["cpu_seconds"] for s in WorkDir(result.run_dir).finished(stage).values())  # task and batch markers
    core_s = {s["stage"]: s["core_seconds"] for s in r["stages"] if s["stage"] != "language"}
    core_s["extract"], core_s["tokenize"] = task_cpu("extract"), task_cpu("tokenize")
    core_s["tokenizer_training"] = marker(result.run_dir, "tokenizer", "train")["_cpu_seconds"]
    text_mb = r["stats"]["extract"]["bytes_out"] / 1e6
    slowest = max((k for k in stage_wall if k not in ("total",)), key=lambda k: stage_wall[k])
    return {"scale": scale, "num_cpus": num_cpus, "run_dir": result.run_dir, "report_total_s": r["total_seconds"],
            "vs_extract": {k: stage_wall[k] / stage_wall["extract"] for k in ("fuzzy_dedup", "decontaminate", "tokenize")
                           if k in stage_wall and stage_wall["extract"]},
            "peak_rss_mb_any_worker": mem.peak / 2**20, "text_mb": text_mb, "input_mb": r["stats"]["extract"]["bytes_in"] / 1e6,
            "documents": r["accounting"]["input"], "partitions": len(glob.glob(os.path.join(result.run_dir, "docs", "*.parquet"))),
            "wall_s": wall, "stage_wall_s": stage_wall, "stage_core_s": core_s, "slowest": slowest,
            "whole_vs_slowest": stage_wall[slowest] / wall,
            "bound_no_gaps": stage_wall[slowest] / sum(stage_wall.values()),
            "bound_cpu_share": max(core_s.values()) / sum(core_s.values()),
            "mb_per_core_s": {s["stage"]: s.get("mb_per_core_s") for s in r["stages"] if s.get("mb_per_core_s")},
            "peak_rss_mb_worker": r["peak_rss_mb_per_worker"],
            "peak_rss_mb_driver": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def marker(run_dir: str, step: str, name: str) -> dict:
    """A finished task's marker (its stats plus ``_seconds`` and ``_cpu_seconds``, pipeline.runner)."""
    from gristmill.pipeline.workdir import WorkDir

    return WorkDir(run_dir).done(step, name)


def warm_up_workers(ray, num_cpus: int) -> None:
    """Start one Ray worker per CPU before the clock: a fresh local Ray's first tasks spend
    about 1.5 s spawning them, which would otherwise be billed to the first stage."""
    @ray.remote(num_cpus=1)
    def pid(_):
        time.sleep(0.5)  # held long enough that every CPU gets its own worker
        return os.getpid()

    ray.get([pid.remote(i) for i in range(num_cpus)])


def tokenize_vs_raw(run_dir: str, root: str) -> dict:
    """The tokenize stage vs raw encode_batch on the same documents, batch size and threads."""
    from gristmill.pipeline.stages.tokenize.config import SplitConfig
    from gristmill.pipeline.stages.tokenizer.config import TokenizerConfig
    from gristmill.pipeline.survivors import Survivors
    from gristmill.pipeline.tokenization import load_tokenizer
    from gristmill.pipeline.stages.tokenize.tasks import tokenize_partition
    from gristmill.pipeline.workdir import WorkDir

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
            tokenize_partition(part, tok_path, cfg, SplitConfig(), Survivors(WorkDir(work)))
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
    ap.add_argument("--num-cpus", type=int, nargs="+", default=[2], help="a run per scale per CPU count (local Ray)")
    ap.add_argument("--job", help="a job file like examples/demo-job-full.yaml instead of the built-in job")
    ap.add_argument("--no-tokenize-compare", action="store_true", help="skip the tokenize stage vs raw comparison")
    ap.add_argument("--out", default="/tmp/gm-bench-pipeline")
    ap.add_argument("--only-tokenize", metavar="RUN_DIR", help="only the tokenize comparison, on a finished run dir")
    ap.add_argument("--shard-mb", type=int, default=32, help="pack.shard_bytes in MiB; the driver holds one shard while packing")
    ap.add_argument("--scale-only", type=int, help=argparse.SUPPRESS)  # one scale, JSON on stdout (run by main)
    ap.add_argument("--json", help="also write the raw results here")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)  # run dirs and the tokenize comparison's symlinks must not be relative
    if args.only_tokenize:
        print(json.dumps(tokenize_vs_raw(args.only_tokenize, args.out), indent=1))
        return 0
    os.makedirs(args.out, exist_ok=True)
    if args.scale_only is not None:
        print(json.dumps(run_scale(args.scale_only, args.out, args.shard_mb, args.num_cpus[0], args.job)))
        return 0
    runs = []
    for scale in args.scales:
        for cpus in args.num_cpus:  # a process per run: peak RSS is a high-water mark
            cmd = [sys.executable, __file__, "--scale-only", str(scale), "--out", args.out, "--shard-mb", str(args.shard_mb),
                   "--num-cpus", str(cpus)] + (["--job", args.job] if args.job else [])
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)  # stderr: shown
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    tok = None if args.no_tokenize_compare else tokenize_vs_raw(runs[-1]["run_dir"], args.out)
    print(json.dumps({"runs": runs, "tokenize_vs_raw": tok}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "tokenize_vs_raw": tok}, f, indent=1)
    print()
    print(f"{'scale':>5} {'CPUs':>4} {'docs':>7} {'parts':>5} {'text MB':>8} {'wall s':>7} {'report s':>8} {'slowest stage':>22} "
          f"{'whole/slowest':>14} {'bound: no gaps':>15} {'bound: CPU share':>17} {'RSS worker MB (extract/tokenize/any)':>38} "
          f"{'RSS driver MB':>14}")
    for r in runs:
        w, slow = r["peak_rss_mb_worker"], f"{r['slowest']} {r['stage_wall_s'][r['slowest']]:.1f}s"
        print(f"{r['scale']:>5} {r['num_cpus']:>4} {r['documents']:>7,} {r['partitions']:>5} {r['text_mb']:>8.1f} {r['wall_s']:>7.1f} "
              f"{r['report_total_s']:>8.1f} {slow:>22} {r['whole_vs_slowest']:>14.2f} {r['bound_no_gaps']:>15.2f} "
              f"{r['bound_cpu_share']:>17.2f} {w['extract']:>14.0f} / {w['tokenize']:.0f} / {r['peak_rss_mb_any_worker']:<12.0f} "
              f"{r['peak_rss_mb_driver']:>14.0f}")
        print(f"      stage wall s {({k: round(v, 2) for k, v in r['stage_wall_s'].items()})}")
        print(f"      stage core s {({k: round(v, 2) for k, v in r['stage_core_s'].items()})}")
        print(f"      wall vs extract {({k: round(v, 2) for k, v in r['vs_extract'].items()})}")
    print("MB/s per core by stage (last run):", {k: round(v, 2) for k, v in runs[-1]["mb_per_core_s"].items()})
    if tok:
        print(f"tokenize stage {tok['stage_mb_s']:.2f} MB/s vs raw encode_batch {tok['raw_mb_s']:.2f} MB/s: "
              f"{tok['stage_vs_raw']:.2f}x (vs encode_batch_fast {tok['raw_fast_mb_s']:.2f} MB/s: {tok['stage_vs_raw_fast']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(HERE))
    sys.exit(main())
