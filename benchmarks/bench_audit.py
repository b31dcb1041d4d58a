"""How long `gristmill audit seen` takes for a dataset of a million sequences.

Builds a synthetic dataset with manifests.synthetic (short rows so it builds in seconds;
documents of 3-24 tokens packed across rows, so the document index has ~1.7 spans per row),
writes a checkpoint meta.json that has consumed every sequence once, then times, in one run,
side by side:

- the audit (`gristmill audit seen` in-process, phase by phase),
- the scalar order function called once per index (what a per-sample replay costs), on a
  sample of indices, extrapolated to the same count.

The audit never reads a token, so its time does not depend on the sequence length; the short
rows only make the dataset quick to build.

    python benchmarks/bench_audit.py [--rows 1000000] [--dir /tmp/bench-audit]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]  # this checkout's packages


def build(root: str, rows: int, seq_len: int, shards: int, seed: int = 0):
    """The dataset (manifests.synthetic, packed documents over 64 input files), its doc-index
    spans and its documents."""
    import pyarrow.parquet as pq

    from gristmill.manifests.synthetic import build_synthetic, even_shards

    published = build_synthetic(root, dataset="bench", seq_len=seq_len, shard_rows=even_shards(rows, -(-rows // shards)),
                                val_rows=(), vocab_size=512, seed=seed, tokens="random", doc_tokens=(3, 24), sources=64,
                                langs=("en", "de", "fr", "en"))
    doc_ids = pq.read_table(os.path.join(published.url, published.manifest.doc_index.path), columns=["doc_id"])
    return published, doc_ids.num_rows, len(doc_ids.column("doc_id").unique())


def write_checkpoint(root: str, published, next_index: int, global_batch: int, world_size: int) -> str:
    """A checkpoint meta.json that consumed ``next_index`` samples, through the trainer's schema
    (trainer/meta.py), minus weights, RNG and file checksums."""
    from gristmill.trainer.meta import new_meta, write_meta

    step = next_index // global_batch
    ckpt = os.path.join(root, "run", "checkpoints", f"step-{step}")
    os.makedirs(ckpt, exist_ok=True)
    m = published.manifest
    loader = {"next_index": next_index, "seed": 1234, "order": "global", "split": "train",
              "global_batch": global_batch, "manifest_sha256": m.sha256}
    write_meta(ckpt, new_meta(step=step, world_size=world_size, global_batch=global_batch, seq_len=m.seq_len,
                              loader=loader, manifest_sha256=m.sha256, manifest_url=published.url))
    return ckpt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seq-len", type=int, default=7)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--scalar-sample", type=int, default=20_000, help="indices timed through the scalar sample_at")
    ap.add_argument("--repeat", type=int, default=3, help="in-process audits (first = cold; best reported too)")
    ap.add_argument("--leak-steps", type=int, default=100, help="steps whose text `audit leak` scans")
    ap.add_argument("--dir", default="/tmp/bench-audit")
    args = ap.parse_args()

    from gristmill.audit.checkpoint import open_manifest, read_checkpoint
    from gristmill.audit.consumed import consumed, parse_steps
    from gristmill.audit.leak import audit_leak
    from gristmill.audit.output import write_table
    from gristmill.audit.seen import audit_seen
    from gristmill.loader.order import sample_at

    shutil.rmtree(args.dir, ignore_errors=True)
    t = time.perf_counter()
    published, n_spans, n_docs = build(args.dir, args.rows, args.seq_len, args.shards)
    build_s = time.perf_counter() - t
    next_index = args.rows // args.global_batch * args.global_batch
    path = write_checkpoint(args.dir, published, next_index, args.global_batch, 8)

    def audit_once() -> tuple[dict, object, object, tuple]:
        times, t = {}, time.perf_counter()
        ckpt = read_checkpoint(path)
        pub = open_manifest(ckpt)
        steps = parse_steps(None, ckpt)
        times["checkpoint + manifest"], t = time.perf_counter() - t, time.perf_counter()
        used = consumed(pub.manifest, ckpt, steps)
        times["order (vectorised)"], t = time.perf_counter() - t, time.perf_counter()
        report = audit_seen(pub, used, steps)
        times["join + aggregate"], t = time.perf_counter() - t, time.perf_counter()
        write_table(report.documents, os.path.join(args.dir, "seen.parquet"))
        times["write documents"] = time.perf_counter() - t
        times["total"] = sum(times.values())
        return times, (ckpt, pub, steps), used, report

    # The first run is cold (fresh process state); the machine is shared, so also report the best of --repeat.
    runs = [audit_once() for _ in range(args.repeat)]
    first = runs[0][0]
    best = {k: min(r[0][k] for r in runs) for k in first}
    (ckpt, pub, steps), used, report = runs[-1][1], runs[-1][2], runs[-1][3]
    total = best["total"]

    # `audit leak` over the first steps: read shards, detokenize the seen spans, scan for 1,000 eval items.
    eval_file = os.path.join(args.dir, "eval.jsonl")
    rng = np.random.default_rng(1)
    with open(eval_file, "w") as f:
        for i in range(1000):
            f.write(json.dumps({"text": " ".join(f"w{w}" for w in rng.integers(2, 512, 20))}) + "\n")
    leak_steps = (1, min(args.leak_steps, steps[1]))
    t = time.perf_counter()
    leak = audit_leak(pub, consumed(pub.manifest, ckpt, leak_steps), eval_file)
    leak_s = time.perf_counter() - t

    # The command a user runs, in a fresh process (imports included).
    cmd = [sys.executable, "-m", "gristmill.cli", "audit", "seen", path, "--out", os.path.join(args.dir, "cli.parquet")]
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    cli_s = time.perf_counter() - t

    sample = np.linspace(0, next_index - 1, args.scalar_sample).astype(np.int64)
    t = time.perf_counter()
    for g in sample:
        sample_at(pub.manifest, "train", ckpt.seed, ckpt.order, int(g))
    scalar_per = (time.perf_counter() - t) / len(sample)
    scalar_total = scalar_per * len(used)

    print(f"dataset: {args.rows:,} sequences of {args.seq_len + 1} tokens, {args.shards} shards, {n_docs:,} documents, "
          f"{n_spans:,} doc-index spans (built in {build_s:.1f} s)")
    print(f"audit seen over {len(used):,} consumed samples ({steps[1]} steps of {args.global_batch}):")
    print(f"  {'phase':<24} {'first':>7}   {'best of ' + str(args.repeat):>9}")
    for k in first:
        print(f"  {k:<24} {first[k]:7.2f} s {best[k]:7.2f} s")
    print(f"  -> {len(used) / first['total']:,.0f} samples/s (first), {len(used) / total:,.0f} samples/s (best)")
    print(f"  -> {report.summary['documents_seen']:,} documents seen ({report.summary['documents_fully_seen']:,} fully)")
    ls = leak.summary
    print(f"audit leak, steps {leak_steps[0]}:{leak_steps[1]}: {ls['documents_checked']:,} documents, "
          f"{ls['tokens_checked']:,} tokens, 1,000 eval items in {leak_s:.2f} s ({ls['tokens_checked'] / leak_s:,.0f} tokens/s)")
    print(f"`gristmill audit seen CHECKPOINT --out FILE.parquet` in a fresh process: {cli_s:.2f} s")
    print(f"scalar sample_at per index: {scalar_per * 1e6:.1f} us -> {scalar_total:,.0f} s for {len(used):,} indices "
          f"(order step alone: vectorised is {scalar_total / best['order (vectorised)']:,.0f}x faster; "
          f"whole audit is {scalar_total / total:,.0f}x faster than the per-index order alone)")


if __name__ == "__main__":
    main()
