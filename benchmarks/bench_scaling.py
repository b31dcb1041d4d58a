"""How `gristmill prepare` cost grows with corpus size: the demo corpus at two scales (default 1x
and 10x), the same job, side by side in one run. The job is examples/demo-job.yaml's (extract,
language ID, exact dedup, tokenize, pack); --full adds fuzzy dedup and decontamination
(examples/demo-job-full.yaml).

    python benchmarks/bench_scaling.py [--scales 1 10] [--full] [--num-cpus 2] [--out /tmp/gm-scaling]

Prints, per stage, core-seconds, wall seconds and the ratio between the scales, plus bytes in,
documents and peak RSS per worker (from each run's report.json), and the largest single-process
RSS of the whole run (driver, Ray and its workers). Results: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import yaml

BIN = os.path.dirname(sys.executable)


def job_for(root: str, num_cpus: int, full: bool) -> dict:
    corpus = os.path.join(root, "corpus")
    job = {
        "inputs": [{"path": f"{corpus}/*.jsonl*"}, {"path": f"{corpus}/*.parquet", "text_field": "content"},
                   {"path": f"{corpus}/*.txt"}, {"path": f"{corpus}/*.warc.gz"}],
        "output": {"store": os.path.join(root, "store"), "dataset": "demo"},
        "work_dir": os.path.join(root, "work"),
        "extract": {"max_chars": 100_000},
        "language": {"allowed": ["en"], "threshold": 0.65},
        "exact_dedup": {"enabled": True},
        "split": {"validation_fraction": 0.05},
        "tokenizer": {"vocab_size": 4096, "sample_bytes": 2_000_000},
        "pack": {"seq_len": 256, "shard_bytes": 1_000_000},
        "runner": {"num_cpus": num_cpus},
    }
    if full:
        job["fuzzy_dedup"] = {"threshold": 0.8}
        job["decontaminate"] = {"eval_sets": [{"name": "demo_qa", "path": os.path.join(root, "evals", "demo_qa.jsonl")}]}
    return job


def run_scale(out: str, scale: int, num_cpus: int, full: bool) -> dict:
    root = os.path.abspath(os.path.join(out, f"scale-{scale}"))  # the job file resolves relative paths against its own dir
    if not os.path.isdir(os.path.join(root, "corpus")):
        subprocess.run([f"{BIN}/gristmill", "demo-corpus", root, "--scale", str(scale)], check=True)
    corpus_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(root, "corpus")) for f in fs)
    job = os.path.join(root, "job.yaml")
    with open(job, "w") as f:
        yaml.safe_dump(job_for(root, num_cpus, full), f)
    # A fresh work dir and store: a resumed run would skip the work we want to time.
    subprocess.run(["rm", "-rf", os.path.join(root, "work"), os.path.join(root, "store")], check=True)
    t0 = time.perf_counter()
    subprocess.run([f"{BIN}/gristmill", "prepare", job, "--quiet"], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    work = os.path.join(root, "work")
    (run_dir,) = [os.path.join(work, d) for d in os.listdir(work)]
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    return {"scale": scale, "corpus_bytes": corpus_bytes, "wall_s": wall, "report": report,
            # ru_maxrss of waited-for descendants: the largest single process (KiB on Linux)
            "max_process_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def print_table(runs: list[dict]) -> None:
    a, b = runs[0], runs[-1]
    print(f"corpus: {a['corpus_bytes'] / 1e6:.1f} MB ({a['scale']}x) vs {b['corpus_bytes'] / 1e6:.1f} MB ({b['scale']}x), "
          f"ratio {b['corpus_bytes'] / a['corpus_bytes']:.1f}")
    print(f"{'stage':<14}{'MB in':>16}{'docs in':>18}{'core s':>18}{'ratio':>7}{'wall s':>18}{'ratio':>7}")
    rows_a = {r["stage"]: r for r in a["report"]["stages"]}
    for rb in b["report"]["stages"]:
        ra = rows_a.get(rb["stage"], {})

        def pair(key, scale=1.0, fmt="{:,.1f}"):
            va, vb = ra.get(key), rb.get(key)
            return (f"{fmt.format(va * scale) if va is not None else '-'} / {fmt.format(vb * scale) if vb is not None else '-'}",
                    f"{vb / va:.1f}" if va and vb else "-")

        mb, _ = pair("bytes_in", 1e-6)
        docs, _ = pair("documents_in", fmt="{:,.0f}")
        core, core_r = pair("core_seconds")
        wall, wall_r = pair("wall_seconds")
        print(f"{rb['stage']:<14}{mb:>16}{docs:>18}{core:>18}{core_r:>7}{wall:>18}{wall_r:>7}")
    for r in runs:
        print(f"{r['scale']}x: total {r['wall_s']:.1f} s wall; peak RSS per worker {r['report']['peak_rss_mb_per_worker']} MB; "
              f"largest process so far {r['max_process_rss_mb']:.0f} MB; {r['report']['stats']['pack']['tokens_out']:,} tokens")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    p.add_argument("--full", action="store_true", help="also fuzzy dedup and decontamination")
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--out", default="/tmp/gm-scaling")
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args()
    runs = [run_scale(args.out, s, args.num_cpus, args.full) for s in args.scales]
    print_table(runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
