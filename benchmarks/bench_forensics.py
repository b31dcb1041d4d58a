"""Issue 42's targets: `audit steps` over 100 steps of a 1M-sample run, and a takedown against a full re-prepare.

``steps``: a synthetic dataset of a million rows (manifests.synthetic, packed documents of 3-24
tokens, as benchmarks/bench_audit.py builds it) and a checkpoint meta.json that consumed every row
once (bench_audit.write_checkpoint), then `audit steps` (audit.steps.audit_steps) over its last 100
steps, in-process: wall and CPU seconds, best of ``--repeat``.

``takedown``: a JSONL corpus of ``--docs`` documents (150 words from a 3,000-word vocabulary) plus,
for each of 10 requested documents, a 1-word edit (a near copy to remove too); `gristmill prepare`
(local runner, no fuzzy dedup so the copies survive) then `gristmill takedown --doc-id ...` of the
10, each in a fresh process, timed side by side (CPU of the whole process tree: resource.getrusage
of the children); checks that only shards holding a removed document were rewritten.

    python benchmarks/bench_forensics.py steps [--rows 1000000]
    python benchmarks/bench_forensics.py takedown [--docs 50000]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]


def bench_steps(args) -> None:
    from bench_audit import build, write_checkpoint

    from gristmill.audit.checkpoint import open_manifest, read_checkpoint
    from gristmill.audit.steps import audit_steps

    shutil.rmtree(args.dir, ignore_errors=True)
    t0 = time.perf_counter()
    published, spans, docs = build(args.dir, args.rows, 7, 8)
    print(f"built {args.rows:,} rows, {spans:,} spans, {docs:,} documents in {time.perf_counter() - t0:.1f} s")
    B = args.global_batch
    ckpt_dir = write_checkpoint(args.dir, published, (args.rows // B) * B, B, 8)
    ckpt = read_checkpoint(ckpt_dir)
    window = (ckpt.step - 99, ckpt.step)
    best = None
    for _ in range(args.repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        report = audit_steps(open_manifest(ckpt), ckpt, window)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        best = min(best or (wall, cpu), (wall, cpu))
        print(f"audit steps {window[0]}:{window[1]} of step-{ckpt.step} (B={B}, {ckpt.step * B:,} samples): "
              f"{report.summary['samples_trained']:,} samples, {report.documents.num_rows:,} documents, "
              f"wall {wall:.2f} s, CPU {cpu:.2f} s")
    print(json.dumps({"bench": "audit_steps", "rows": args.rows, "steps": 100, "global_batch": B,
                      "best_wall_s": round(best[0], 3), "best_cpu_s": round(best[1], 3)}))


def _corpus(path: str, n: int, requested: int = 10, seed: int = 42) -> list[str]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(3000)]
    asked = [f"d{i:07d}" for i in rng.sample(range(n), requested)]
    asked_set = set(asked)
    with open(path, "w") as f:
        for i in range(n):
            words = [rng.choice(vocab) for _ in range(150)]
            f.write(json.dumps({"id": f"d{i:07d}", "text": " ".join(words), "url": f"https://example.org/{i}"}) + "\n")
            if f"d{i:07d}" in asked_set:  # its near copy, as a run without fuzzy dedup keeps it
                words[rng.randrange(150)] = "edited"
                f.write(json.dumps({"id": f"c{i:07d}", "text": " ".join(words)}) + "\n")
    return asked


def _timed(cmd: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_takedown(args) -> None:
    import yaml

    from gristmill.manifests import load_manifest

    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    corpus = os.path.join(args.dir, "in.jsonl")
    asked = _corpus(corpus, args.docs)
    job = {"inputs": [{"path": corpus, "id_field": "id"}],
           "output": {"store": os.path.join(args.dir, "store"), "dataset": "web", "report_html": False},
           "work_dir": os.path.join(args.dir, "work"), "language": {"enabled": False},
           "fuzzy_dedup": {"enabled": False}, "split": {"validation_fraction": 0.0},
           "tokenizer": {"vocab_size": 4000, "sample_bytes": 2_000_000},
           "pack": {"seq_len": 2048, "shard_bytes": args.shard_bytes}, "runner": {"kind": "local", "num_cpus": 2}}
    with open(os.path.join(args.dir, "job.yaml"), "w") as f:
        yaml.safe_dump(job, f)
    gm = [sys.executable, "-m", "gristmill"]
    prep_wall, prep_cpu = _timed(gm + ["prepare", os.path.join(args.dir, "job.yaml")])
    v1 = os.path.join(args.dir, "store", "web", "v1")
    td = gm + ["takedown", v1, "--reason", "benchmark", "--report", os.path.join(args.dir, "td.md")]
    for d in asked:
        td += ["--doc-id", d]
    td_wall, td_cpu = _timed(td)
    with open(os.path.join(args.dir, "td.json")) as f:
        report = json.load(f)
    v = report["versions"][0]
    removed = {d["doc_id"] for d in v["removed"]}
    m1 = load_manifest(v1).manifest
    from gristmill.manifests.doc_index import read_published_doc_index

    spans = read_published_doc_index(load_manifest(v1), columns=["shard", "doc_id"]).to_pylist()
    holding = {m1.shards[s["shard"]].path for s in spans if s["doc_id"] in removed}
    rewritten = set(v["new"]["shards_rewritten"]) | set(v["new"]["shards_dropped"])
    out = {"bench": "takedown", "docs": args.docs, "shards": len(m1.shards), "removed": len(removed),
           "near_copies_removed": sum(d["match"] == "near copy" for d in v["removed"]),
           "shards_rewritten": len(rewritten), "shards_holding_removed": len(holding),
           "only_holding_rewritten": rewritten == holding,
           "prepare_wall_s": round(prep_wall, 1), "prepare_cpu_s": round(prep_cpu, 1),
           "takedown_wall_s": round(td_wall, 1), "takedown_cpu_s": round(td_cpu, 1),
           "ratio_wall": round(td_wall / prep_wall, 3), "ratio_cpu": round(td_cpu / prep_cpu, 3)}
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("steps")
    s.add_argument("--rows", type=int, default=1_000_000)
    s.add_argument("--global-batch", type=int, default=1024)
    s.add_argument("--repeat", type=int, default=3)
    s.add_argument("--dir", default="/tmp/bench-forensics-steps")
    t = sub.add_parser("takedown")
    t.add_argument("--docs", type=int, default=50_000)
    t.add_argument("--shard-bytes", type=int, default=4 << 20)
    t.add_argument("--dir", default="/tmp/bench-forensics-takedown")
    args = ap.parse_args()
    (bench_steps if args.what == "steps" else bench_takedown)(args)


if __name__ == "__main__":
    main()
