"""An S3 work dir against a local one: the same prepare job, side by side in one run (issue 23,
target: S3 at most 2x the local-disk time; numbers in docs/benchmarks.md).

    python benchmarks/bench_s3.py [--scale 1] [--rounds 2] [--out /tmp/gm-bench-s3]

Starts the tests' local S3 server (moto on 127.0.0.1, tests/s3server.py), uploads the demo
corpus (``gristmill demo-corpus --scale N``) to it, then alternates ``gristmill prepare`` runs
(fresh processes, fresh embedded Ray, 2 CPUs) of the demo job with quality, fuzzy dedup and
decontamination on:

* local: inputs, work dir and store on the local disk;
* s3: inputs, work dir and store on the S3 server.

Reports each run's wall time (the whole command) and report.json's ``total_seconds`` (the
driver's run: Ray start, stages and publish; not the interpreter's start-up), the s3 / local
ratios of the medians, and checks that the two runs' shards are the same (tokens hash the same;
the manifests differ only in the input URIs they record).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from helpers import demo_job_dict  # noqa: E402
from s3server import S3Server  # noqa: E402


def job(corpus: str, inputs_root: str, out: str) -> dict:
    from pathlib import Path

    d = demo_job_dict(Path(corpus), Path(corpus), quality={}, fuzzy_dedup={"threshold": 0.8},
                      decontaminate={"eval_sets": [{"name": "demo_qa", "path": f"{inputs_root}/evals/demo_qa.jsonl",
                                                    "id_field": "id"}]},
                      runner={"num_cpus": 2})
    d["inputs"] = [json.loads(json.dumps(i).replace(corpus, inputs_root)) for i in d["inputs"]]
    d["output"]["store"], d["work_dir"] = f"{out}/store", f"{out}/work"
    return d


def run(job_dict: dict, where: str, env: dict) -> dict:
    import fsspec

    from gristmill.manifests import load_manifest

    path = os.path.join(where, f"job-{time.monotonic_ns()}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(job_dict, f)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gristmill", "prepare", path], capture_output=True, text=True,
                          env={**os.environ, **env})
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    pub = load_manifest(f"{job_dict['output']['store']}/demo")
    fs, root = fsspec.core.url_to_fs(job_dict["work_dir"])
    (report,) = [p for p in fs.glob(f"{root}/*/report.json")]
    stages_s = json.loads(fs.cat_file(report))["total_seconds"]
    return {"wall_s": wall, "stages_s": stages_s, "shards": [s.sha256 for s in pub.manifest.shards]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="/tmp/gm-bench-s3")
    args = ap.parse_args()
    from gristmill.pipeline.demo_corpus import write_demo_corpus

    shutil.rmtree(args.out, ignore_errors=True)
    corpus = os.path.join(args.out, "demo")
    write_demo_corpus(corpus, scale=args.scale)
    server = S3Server(os.path.join(args.out, "moto.log")).start()
    try:
        os.environ.update(server.env)
        import fsspec

        bucket = server.new_bucket()
        fs = fsspec.filesystem("s3")
        for d in ("corpus", "evals"):
            fs.put(os.path.join(corpus, d), f"{bucket[5:]}/demo/{d}", recursive=True)
        results: dict[str, list] = {"local": [], "s3": []}
        for r in range(args.rounds):
            for kind in ("local", "s3"):
                out = os.path.join(args.out, f"{kind}-{r}") if kind == "local" else f"{bucket}/{kind}-{r}"
                inputs = corpus if kind == "local" else f"{bucket}/demo"
                res = run(job(corpus, inputs, out), args.out, server.env)
                results[kind].append(res)
                print(f"round {r} {kind:5s}: wall {res['wall_s']:6.1f} s, stages {res['stages_s']:6.1f} s", flush=True)
        same = all(res["shards"] == results["local"][0]["shards"] for k in results for res in results[k])
        med = {k: {m: statistics.median(x[m] for x in v) for m in ("wall_s", "stages_s")} for k, v in results.items()}
        print(f"median local: wall {med['local']['wall_s']:.1f} s, stages {med['local']['stages_s']:.1f} s")
        print(f"median s3   : wall {med['s3']['wall_s']:.1f} s, stages {med['s3']['stages_s']:.1f} s")
        print(f"s3 / local  : wall {med['s3']['wall_s'] / med['local']['wall_s']:.2f}x, "
              f"stages {med['s3']['stages_s'] / med['local']['stages_s']:.2f}x; same shards: {same}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
