"""Appending to a published version (issue 25, targets 2 and 3): a run over 10% new data deduplicated
against v1, beside a full re-prepare of old + new; and the dedup index's share of a version's bytes.

    .venv/bin/python benchmarks/bench_dedup_incremental.py [--originals 4500] [--runs 1] [--out /tmp/gm-dedup-incr]
        [--synthetic] [--new-files 1]

Start it without flock: each prepare takes /tmp/gristmill-heavy.lock itself (bench_vs_datatrove's
``timed_run``; the wait is not timed).

The corpus is bench_dedup_heavy's (real text of this machine, heavy near-duplication, shuffled):
the first 90% of its documents are the old data, the last 10% the new (a new crawl: about two
thirds of it near or exact copies of documents already published). This machine has text for
~4,500 originals (~16,000 documents); ``--synthetic`` makes the originals from the real texts'
word frequencies instead (words drawn independently: mutually distinct like the real ones, and
as many as asked), then the same clusters, copies and hard negatives, for a v1 of 100k+
documents. ``--new-files K``: the new data in K files and the old in 9 K (one partition a file:
the same file size on both sides, and enough partitions for every core). The corpus is built
once per ``--out`` and kept. Jobs: language ID, exact and
fuzzy dedup, PII, tokenize and pack, all with v1's tokenizer (a growing corpus keeps its
tokenizer, and the versions must share one to mix). Timed, interleaved ``--runs`` times:

* **full**: one prepare over old + new (old first in input order);
* **append**: one prepare over the new data with ``dedup_against: [v1]``.

Reported: wall (process start to exit, Ray start-up included), the pipeline's own seconds
(report.json ``total_seconds``), and the summed CPU seconds of the tasks; the ratio append / full
of each; the kept-document check (kept(v1) + kept(append) == kept(full)); and the bytes of v1's
dedup index against all of v1's bytes. Results: ``OUT/results.json``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_dedup_heavy as heavy  # noqa: E402
import bench_vs_datatrove as vs  # noqa: E402


def synthetic_texts(rng, n: int, real_texts) -> list[str]:
    """``n`` texts of 120-600 words drawn independently from the word frequencies of this
    machine's real texts (bench_dedup_heavy.real_texts)."""
    import numpy as np

    counts: dict[str, int] = {}
    for t in real_texts(rng):
        for w in t.split():
            counts[w] = counts.get(w, 0) + 1
    words = sorted(counts)
    p = np.array([counts[w] for w in words], np.float64)
    g = np.random.default_rng(rng.randrange(1 << 30))
    lengths = g.integers(120, 601, n)
    draws = g.choice(len(words), size=int(lengths.sum()), p=p / p.sum())
    ends = np.cumsum(lengths)
    return [" ".join(words[k] for k in draws[e - m:e]) for e, m in zip(ends.tolist(), lengths.tolist())]


def build(src: str, originals: int, synthetic: bool) -> dict:
    """The corpus in ``src`` (kept: built again only for other arguments)."""
    marker = os.path.join(src, "corpus.json")
    want = {"originals": originals, "synthetic": synthetic}
    if os.path.exists(marker):
        with open(marker) as f:
            info = json.load(f)
        if info.get("args") == want:
            return info
    shutil.rmtree(src, ignore_errors=True)
    real = heavy.real_texts
    if synthetic:  # build_corpus takes its originals from real_texts: hand it synthetic ones
        heavy.real_texts = lambda rng: synthetic_texts(rng, int(originals * 1.7), real)
    try:
        info = heavy.build_corpus(src, originals)
    finally:
        heavy.real_texts = real
    info = {k: v for k, v in info.items() if k != "truth"} | {"args": want}
    with open(marker, "w") as f:
        json.dump(info, f)
    return info


def split_corpus(src: str, out: str, new_files: int = 1) -> dict:
    """old/ (the first 90% of the documents, 9 x ``new_files`` files), new/ (the last 10%,
    ``new_files`` files) and both/ (all)."""
    docs = []
    for path in sorted(glob.glob(os.path.join(src, "*.jsonl"))):
        with open(path) as f:
            docs += f.read().splitlines()
    cut = len(docs) * 9 // 10
    for d in ("old", "new", "both"):
        shutil.rmtree(os.path.join(out, d), ignore_errors=True)
        os.makedirs(os.path.join(out, d))

    def write(rows: list[str], n: int, prefix: str, dirs: tuple[str, ...]) -> None:
        per = -(-len(rows) // n)
        for k in range(n):
            for d in dirs:
                with open(os.path.join(out, d, f"{prefix}-{k:03d}.jsonl"), "w") as f:
                    f.write("\n".join(rows[k * per:(k + 1) * per]) + "\n")

    write(docs[:cut], 9 * new_files, "a-old", ("old", "both"))
    write(docs[cut:], new_files, "b-new", ("new", "both"))
    return {"old": cut, "new": len(docs) - cut, "old_files": 9 * new_files, "new_files": new_files}


def job(inputs: str, run_dir: str, dataset: str, tokenizer: str | None, num_cpus: int, against=None) -> dict:
    d = {"inputs": [inputs], "output": {"store": os.path.join(run_dir, "store"), "dataset": dataset, "report_html": False},
         "work_dir": os.path.join(run_dir, "work"), "fuzzy_dedup": {}, "split": {"validation_fraction": 0.0},
         "tokenizer": {"path": tokenizer} if tokenizer else {"vocab_size": 4096},
         "pack": {"seq_len": 2048}, "runner": {"num_cpus": num_cpus}}
    if against:
        d["dedup_against"] = against
    return d


def run(job_dict: dict, run_dir: str) -> dict:
    import yaml

    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    path = os.path.join(run_dir, "job.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(job_dict, f, sort_keys=False)
    res = vs.timed_run([os.path.join(vs.ROOT, ".venv", "bin", "python"), "-m", "gristmill", "prepare", path],
                       os.path.join(run_dir, "prepare.log"))
    (report_path,) = glob.glob(os.path.join(run_dir, "work", "*", "report.json"))
    with open(report_path) as f:
        report = json.load(f)
    cpu = sum(s.get("core_seconds") or 0.0 for s in report["stages"])
    steps = {}
    for path in glob.glob(os.path.join(run_dir, "work", "*", "_done", "dedup_against.*", "*.json")):
        with open(path) as f:
            st = json.load(f)
        step = os.path.basename(os.path.dirname(path))
        for task in (st["tasks"].values() if path.endswith(".batch.json") else [st]):  # a batch's marker lists its tasks
            steps[step] = steps.get(step, 0.0) + task.get("_cpu_seconds", 0.0)
    return {**res, "pipeline_s": report["total_seconds"], "task_cpu_s": cpu, "url": report["url"],
            "stages": {s["stage"]: s.get("wall_seconds") for s in report["stages"]},
            "stage_cpu_s": {s["stage"]: s.get("core_seconds") for s in report["stages"]},
            "dedup_against_cpu_s": steps}


def kept(url: str) -> set:
    from gristmill.manifests import load_manifest
    from gristmill.manifests.doc_index import read_published_doc_index

    return set(read_published_doc_index(load_manifest(url), columns=["doc_id"]).column("doc_id").to_pylist())


def version_bytes(url: str) -> dict:
    from gristmill.manifests import load_manifest

    m = load_manifest(url).manifest
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(url) for f in fs)
    index = sum(f.bytes for f in m.dedup_index)
    return {"version_bytes": total, "dedup_index_bytes": index, "shard_bytes": sum(s.bytes for s in m.shards),
            "doc_index_bytes": m.doc_index.bytes, "documents": sum(f.rows for f in m.dedup_index),
            "share": index / total, "share_without_index": index / (total - index)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--originals", type=int, default=4500)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", default="/tmp/gm-dedup-incr")
    ap.add_argument("--synthetic", action="store_true", help="originals from real word frequencies (any size)")
    ap.add_argument("--new-files", type=int, default=1, help="files of new data (the old data: 9x as many)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    src = os.path.join(a.out, "corpus")
    info = build(src, a.originals, a.synthetic)
    sizes = split_corpus(src, a.out, a.new_files)
    print(f"corpus: {info['documents']} documents, {info['bytes'] / 1e6:.1f} MB; old {sizes['old']}, new {sizes['new']}",
          flush=True)
    tok = os.path.join(a.out, "tokenizer.json")
    if not os.path.exists(tok):
        vs.train_tokenizer(os.path.join(a.out, "old"), tok)
    v1 = run(job(os.path.join(a.out, "old", "*.jsonl"), os.path.join(a.out, "v1"), "web", tok, a.num_cpus),
             os.path.join(a.out, "v1"))
    print(f"v1 (old data): {v1['wall_s']:.1f} s", flush=True)
    full, append = [], []
    for k in range(a.runs):
        d = os.path.join(a.out, f"full-{k + 1}")
        full.append(run(job(os.path.join(a.out, "both", "*.jsonl"), d, "web-all", tok, a.num_cpus), d))
        print(f"full run {k + 1}: {full[-1]['wall_s']:.1f} s", flush=True)
        d = os.path.join(a.out, f"append-{k + 1}")
        append.append(run(job(os.path.join(a.out, "new", "*.jsonl"), d, "web-new", tok, a.num_cpus, [v1["url"]]), d))
        print(f"append run {k + 1}: {append[-1]['wall_s']:.1f} s", flush=True)
    k1, kf, ka = kept(v1["url"]), kept(full[0]["url"]), kept(append[0]["url"])
    res = {"corpus": info, "split": sizes,
           "same_kept": k1 | ka == kf and not (k1 & ka), "kept": {"v1": len(k1), "append": len(ka), "full": len(kf)},
           "only_full": len(kf - (k1 | ka)), "only_split": len((k1 | ka) - kf),
           "only_split_of_v1": len(k1 - kf), "examples": sorted(kf ^ (k1 | ka))[:20],
           "index": version_bytes(v1["url"]), "v1": v1, "full": full, "append": append}
    for key in ("wall_s", "pipeline_s", "task_cpu_s"):
        res[f"ratio_{key}"] = statistics.median(r[key] for r in append) / statistics.median(r[key] for r in full)
    print(f"\nkept: v1 {len(k1)} + append {len(ka)} = {len(k1 | ka)}; full {len(kf)}; equal: {res['same_kept']} "
          f"(kept by the two runs only: {res['only_split']}, {res['only_split_of_v1']} of them v1's; by the full run "
          f"only: {res['only_full']})")
    print(f"{'':>8} {'wall s':>8} {'pipeline s':>10} {'task CPU s':>10}")
    for name, rs in (("full", full), ("append", append)):
        for r in rs:
            print(f"{name:>8} {r['wall_s']:>8.1f} {r['pipeline_s']:>10.1f} {r['task_cpu_s']:>10.1f}")
    print(f"append / full: wall {res['ratio_wall_s']:.3f}, pipeline {res['ratio_pipeline_s']:.3f}, "
          f"task CPU {res['ratio_task_cpu_s']:.3f}")
    for r in append:
        print(f"append: dedup_against {r['stage_cpu_s'].get('dedup_against') or 0:.2f} core-s "
              f"({', '.join(f'{k.split(chr(46))[1]} {v:.2f}' for k, v in sorted(r['dedup_against_cpu_s'].items()))})")
    ix = res["index"]
    print(f"v1: {ix['version_bytes'] / 1e6:.2f} MB in all, shards {ix['shard_bytes'] / 1e6:.2f} MB, dedup index "
          f"{ix['dedup_index_bytes'] / 1e6:.3f} MB ({ix['documents']} documents, "
          f"{ix['dedup_index_bytes'] / max(1, ix['documents']):.0f} B each): {100 * ix['share']:.1f}% of the version "
          f"({100 * ix['share_without_index']:.1f}% on top of the rest)")
    heavy.write_results(a.out, res)


if __name__ == "__main__":
    main()
