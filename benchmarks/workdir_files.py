"""Files a prepare leaves in its run dir per partition (issue 32: at most 6, markers and task logs included).

    .venv/bin/python benchmarks/workdir_files.py [--partitions 16 250] [--files 500] [--out bench-out/workdir-files]

Runs every stage (language, exact dedup, quality, fuzzy dedup, decontamination against an eval set and
the validation split, PII, tokenizer, tokenize, pack) on one fixed corpus (tests/corpus_split.py: one
document per file, ``--files`` files) grouped into each P of ``--partitions`` partitions, local runner,
2 workers (the default batching), and prints the run dir's files by top-level folder, per partition.
Take /tmp/gristmill-heavy.lock around it for P >= 250. ``count_files`` is the measure the tests use.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

# the run's single files (not per partition): the report, the exports, the tokenizer, the pack's staging
SINGLE = ("report.json", "accounting.json", "quarantine.jsonl", "removed.jsonl", "tokenizer.json", "staging")


def count_files(run_dir: str) -> dict[str, int]:
    """Files under ``run_dir`` by top-level folder (``_done`` markers and ``logs`` included), the run's
    single files and the dataset staged for publishing left out."""
    out: collections.Counter = collections.Counter()
    for top in sorted(os.listdir(run_dir)):
        if top in SINGLE:
            continue
        path = os.path.join(run_dir, top)
        if os.path.isfile(path):
            out[top] += 1
            continue
        for _, _, names in os.walk(path):
            out[top] += len(names)
    return dict(out)


def job_dict(corpus: str, evals: str, out: str, partitions: int, files: int, file_bytes: int) -> dict:
    return {
        "inputs": [os.path.join(corpus, "*.jsonl")],
        "output": {"store": os.path.join(out, "store"), "dataset": "files", "report_html": False},
        "work_dir": os.path.join(out, "work"),
        "language": {"allowed": ["en"], "threshold": 0.3},
        "quality": {"c4": {"drop_lines": True}},
        "fuzzy_dedup": {"threshold": 0.8},
        "decontaminate": {"eval_sets": [{"name": "qa", "path": evals, "id_field": "id"}]},
        
        "split": {"validation_fraction": 0.05},
        "tokenizer": {"vocab_size": 400, "sample_bytes": 200_000},
        "pack": {"seq_len": 64, "shard_bytes": 100_000},
        "runner": {"kind": "local", "num_cpus": 2},
        "partitioning": {"partition_bytes": files // partitions * file_bytes},
    }


def main() -> None:
    import yaml

    from corpus_split import write_split_corpus
    from gristmill.pipeline.config import load_job
    from gristmill.pipeline.demo_corpus import stdlib_paragraphs
    from gristmill.pipeline.executor import prepare

    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, nargs="+", default=[16, 250])
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "bench-out", "workdir-files"))
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    info = write_split_corpus(os.path.join(args.out, "corpus"), files=args.files, docs_per_file=1, paragraphs_per_doc=3)
    evals = os.path.join(args.out, "evals.jsonl")
    with open(evals, "w") as f:
        for i, p in enumerate(stdlib_paragraphs()[::400]):
            f.write(json.dumps({"id": f"q{i}", "text": p}) + "\n")
    for p in args.partitions:
        out = os.path.join(args.out, f"P{p}")
        os.makedirs(out)
        job = os.path.join(out, "job.yaml")
        with open(job, "w") as f:
            yaml.safe_dump(job_dict(os.path.join(args.out, "corpus"), evals, out, p, args.files, info["file_bytes"]), f)
        res = prepare(load_job(job), quiet=True)
        counts = count_files(res.run_dir)
        total = sum(counts.values())
        print(f"P = {p}: {total} files, {total / p:.2f} per partition; manifest {res.manifest_sha256[:12]}")
        for top, n in sorted(counts.items(), key=lambda kv: -kv[1]):
            print(f"  {top:<16} {n:>7} {n / p:>7.2f}")


if __name__ == "__main__":
    main()
