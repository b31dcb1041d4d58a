"""`make demo`: the whole data path on an embedded default, each step printing what it did.

demo corpus -> prepare (Ray) -> verify -> loader bench -> CPU training run -> audit -> reports.
Every step is the real CLI command a user would type; the demo only strings them together.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "demo-out")
DATASET = os.path.join(OUT, "store", "demo-full")  # the dataset examples/demo-job-full.yaml publishes
RUN = os.path.join(OUT, "run")

STEPS = [
    ("Write the demo corpus (JSONL/.gz/.zst, Parquet, text, WARC; planted duplicates, leaks, bad records)",
     ["demo-corpus", OUT]),
    ("Prepare it with local worker processes: extract, language filter, exact dedup, quality rules, fuzzy dedup, decontaminate, tokenize, pack, publish",
     ["prepare", "examples/demo-job-full.yaml"]),
    ("Re-hash every shard, the document index and the tokenizer against the manifest",
     ["manifest", "verify", DATASET]),
    ("Measure trainer input-wait through a simulated remote store (20 ms per request, 50 ms steps)",
     ["loader", "bench", DATASET, "--steps", "30", "--step-ms", "50", "--latency-ms", "20",
      "--global-batch", "8", "--cache-dir", os.path.join(OUT, "bench-cache"), "--json", os.path.join(OUT, "loader-bench.json")]),
    ("Train a tiny Llama-style model on CPU; checkpoints record the manifest hash",
     ["train", "configs/train-tiny.yaml", "--set", f"data.manifest={DATASET}", "--set", f"run.dir={RUN}"]),
    ("Audit: exactly which shards and documents the model saw",
     ["audit", "seen", RUN, "--out", os.path.join(OUT, "seen.parquet")]),
    ("Audit: did the demo eval set leak into what the model saw? (it was decontaminated, so: no)",
     ["audit", "leak", RUN, "--eval", os.path.join(OUT, "evals", "demo_qa.jsonl")]),
    ("Report: the dataset's data card as one HTML page (prepare wrote it too, beside report.json)",
     ["report", DATASET, "--work-dir", os.path.join(OUT, "work")]),
    ("Report: the training run as one HTML page (loss, throughput, ranks, checkpoints, what the model saw)",
     ["report", RUN]),
]


def main() -> int:
    for d in ("store", "work", "run", "bench-cache"):
        shutil.rmtree(os.path.join(OUT, d), ignore_errors=True)
    started = time.time()
    for i, (what, args) in enumerate(STEPS, 1):
        print(f"\n=== [{i}/{len(STEPS)}] {what}\n$ gristmill {shlex.join(args)}", flush=True)
        t = time.time()
        rc = subprocess.call([sys.executable, "-m", "gristmill", *args], cwd=ROOT)
        if rc != 0:
            print(f"\ndemo: step {i} failed with exit code {rc}", file=sys.stderr)
            return rc
        print(f"--- step {i} done in {time.time() - t:.1f}s", flush=True)
    print(f"\nDemo finished in {time.time() - started:.0f}s. Everything it made is under {OUT}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
