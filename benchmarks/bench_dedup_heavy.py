"""Fuzzy dedup on heavy near-duplication from real text, gristmill against datatrove 0.10.1 (issue 25, target 1).

    .venv/bin/python benchmarks/bench_dedup_heavy.py [--originals 2000] [--runs 1] [--out /tmp/gm-dedup-heavy]

Start it without flock: the timed runs take /tmp/gristmill-heavy.lock themselves (bench_vs_datatrove's
``timed_run``). datatrove runs in its own venv (see benchmarks/bench_vs_datatrove.py's docstring).

The corpus is built here, from real text on this machine, and is held out from any tuning:

* **originals**: the docstrings of the Python standard library (``/usr/lib/python3.*``, one document per
  module's docstrings joined and cut into documents of 120-600 words, at most 3 a module) and the text
  files of ``/usr/share/doc`` (READMEs, NEWS,
  changelogs, gzip read; licence files left out), cut into 150-500-word documents. Originals that
  resemble one another (exact Jaccard >= 0.3 on gristmill's 5-word shingles, found with a wide LSH and
  verified) are dropped, so the truth below is the only near-duplication in the corpus.
* **near copies**: 40% of the originals get a cluster of 1 to 200 documents (the original and its copies;
  sizes drawn from a power law, with a few of 200). A copy is the original with 0.3-1.5% of its words
  replaced, deleted or inserted, and sometimes a line of boilerplate added at the top or bottom
  (exact Jaccard with the original ~0.85-0.97). Over half of all documents are near copies.
* **hard negatives** (1-2 for a quarter of the originals): documents derived from an original by
  heavier edits (3-9% of words), kept only when their exact Jaccard with the original is 0.45-0.75
  and below 0.8 with every member of the original's cluster and every other hard negative of it:
  no document is a near duplicate of them.
* every document in a random order, over 4 JSONL files (partitions).

Both tools run their whole ``prepare`` (language ID, exact dedup, fuzzy dedup, tokenize; the
bench_vs_datatrove settings: threshold 0.8, 5-word shingles; datatrove 14 bands x 9 rows, gristmill
its own banding unless ``--gm-bands-rows``), interleaved ``--runs`` times. Measured, over the documents
that reached fuzzy dedup in both tools (language ID and exact dedup removed the same ids in both):

* **near copies left standing**: for each cluster, its members (original + copies with exact Jaccard
  >= 0.85 to the original) that survive, less one (the one that should stand), summed;
* **false merges**: hard negatives removed as near duplicates;
* **fuzzy dedup wall** (gristmill's stage; datatrove's four MinHash steps) and the ratio.
Results: ``OUT/results.json``.
"""
from __future__ import annotations

import argparse
import ast
import glob
import gzip
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_vs_datatrove as vs  # noqa: E402  (the datatrove driver, timed runs, tokenizer)

BOILER = ["Posted in Documentation. Leave a comment.", "Share this page: Twitter, Facebook, Email.",
          "This page was last edited on 3 March 2026.", "Skip to main content", "Copyright 2026 The Authors."]
NEAR, HARD = 0.85, (0.45, 0.75)


# -- real text ------------------------------------------------------------------------------------
def _docstrings(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            d = ast.get_docstring(node)
            if d and len(d.split()) >= 20:
                out.append(d)
    return out


def _chunks(words: list[str], lo: int, hi: int, rng: random.Random) -> list[str]:
    out, i = [], 0
    while len(words) - i >= lo:
        n = rng.randint(lo, hi)
        out.append(" ".join(words[i:i + n]))
        i += n
    return out


def real_texts(rng: random.Random) -> list[str]:
    texts = []
    for path in sorted(glob.glob("/usr/lib/python3.*/**/*.py", recursive=True)):
        if "/test" in path or "site-packages" in path or "dist-packages" in path:
            continue
        words = " ".join(_docstrings(path)).split()
        texts += _chunks(words, 120, 600, rng)[:3]
    for path in sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
        base = os.path.basename(path).lower()
        if not os.path.isfile(path) or "copyright" in base or "license" in base or "copying" in base:
            continue
        try:
            if path.endswith(".gz"):
                with gzip.open(path, "rt", encoding="utf-8") as f:
                    raw = f.read(200_000)
            elif "." not in base or base.endswith((".md", ".txt", ".rst")):
                with open(path, encoding="utf-8") as f:
                    raw = f.read(200_000)
            else:
                continue
        except (UnicodeDecodeError, OSError, EOFError, gzip.BadGzipFile):
            continue
        texts += _chunks(raw.split(), 150, 500, rng)[:4]
    return texts


def distinct(texts: list[str], mh, limit: float = 0.3) -> list[int]:
    """Indices of texts no earlier kept text resembles (exact Jaccard >= limit), found with a wide
    LSH (32 bands x 4 rows: a pair at 0.3 is a candidate 23% of the time, at 0.5 87%) and verified."""
    import numpy as np

    from gristmill.pipeline.lsh import band_keys
    from gristmill.pipeline.minhash import jaccard

    sh = mh.shingles(texts)
    sig = mh.signatures_of(sh)
    keys = band_keys(sig, 32, 4)
    sets = [np.unique(sh.of(i)) for i in range(len(texts))]
    seen: dict[tuple[int, int], list[int]] = {}
    keep = []
    for i in range(len(texts)):
        if len(sets[i]) < 50:
            continue
        others = {j for b in range(32) for j in seen.get((b, int(keys[i, b])), [])}
        if any(jaccard(sets[i], sets[j]) >= limit for j in others):
            continue
        keep.append(i)
        for b in range(32):
            seen.setdefault((b, int(keys[i, b])), []).append(i)
    return keep


# -- derived documents ------------------------------------------------------------------------------
def edit(words: list[str], rate: float, vocab: list[str], rng: random.Random) -> list[str]:
    out = []
    for w in words:
        u = rng.random()
        if u < rate / 3:
            continue  # delete
        if u < 2 * rate / 3:
            out.append(rng.choice(vocab))  # replace
            continue
        out.append(w)
        if u < rate:
            out.append(rng.choice(vocab))  # insert
    return out


def cluster_sizes(n: int, rng: random.Random) -> list[int]:
    """Cluster sizes (original + copies) in 1..200: a power law, and a few clusters of 200."""
    sizes = [min(200, int(1 / (1 - rng.random()))) for _ in range(n)]
    for k in range(min(4, n)):
        sizes[k] = 200
    return sizes


def build_corpus(out_dir: str, n_originals: int, seed: int = 0) -> dict:
    import numpy as np

    from gristmill.pipeline.minhash import MinHasher, jaccard

    rng = random.Random(seed)
    mh = MinHasher()
    texts = real_texts(rng)
    rng.shuffle(texts)
    texts = texts[: int(n_originals * 1.6)]
    keep = distinct(texts, mh)
    originals = [texts[i] for i in keep][:n_originals]
    vocab = sorted({w for t in originals for w in t.split()})

    def sset(t: str):
        return np.unique(mh.shingles([t]).hashes)

    docs: list[dict] = []  # {"text", "kind", "family", "j"}
    n_clustered = 2 * n_originals // 5
    sizes = cluster_sizes(n_clustered, rng)
    for f, text in enumerate(originals):
        words = text.split()
        docs.append({"text": text, "kind": "original", "family": f, "j": 1.0})
        members = [sset(text)]
        if f < n_clustered:
            for _ in range(sizes[f] - 1):
                w = edit(words, rng.uniform(0.003, 0.015), vocab, rng)
                t = " ".join(w)
                if rng.random() < 0.3:
                    t = f"{rng.choice(BOILER)}\n{t}" if rng.random() < 0.5 else f"{t}\n{rng.choice(BOILER)}"
                s = sset(t)
                docs.append({"text": t, "kind": "copy", "family": f, "j": jaccard(s, members[0])})
                members.append(s)
        if f % 4 == 0:  # hard negatives for a quarter of the originals, clustered or not
            hards = []
            for _ in range(rng.randint(1, 2)):
                t = " ".join(edit(words, rng.uniform(0.03, 0.09), vocab, rng))
                s = sset(t)
                j0 = jaccard(s, members[0])
                if HARD[0] <= j0 <= HARD[1] and all(jaccard(s, m) < 0.8 for m in members[1:] + hards):
                    docs.append({"text": t, "kind": "hard_negative", "family": f, "j": j0})
                    hards.append(s)
    rng.shuffle(docs)
    os.makedirs(out_dir, exist_ok=True)
    per = -(-len(docs) // 4)
    truth = []
    for p in range(4):
        name = f"heavy-{p}.jsonl"
        with open(os.path.join(out_dir, name), "w") as f:
            for i, d in enumerate(docs[p * per:(p + 1) * per]):
                f.write(json.dumps({"text": d["text"]}) + "\n")
                truth.append({"id": f"{name}:{i}", "kind": d["kind"], "family": d["family"], "j": round(d["j"], 4)})
    kinds = {k: sum(t["kind"] == k for t in truth) for k in ("original", "copy", "hard_negative")}
    return {"truth": truth, "documents": len(truth), "kinds": kinds, "clusters": n_clustered,
            "cluster_sizes": sorted(sizes, reverse=True)[:10], "bytes": sum(len(d["text"].encode()) for d in docs),
            "copy_j": {"min": min(t["j"] for t in truth if t["kind"] == "copy"),
                       "median": statistics.median(t["j"] for t in truth if t["kind"] == "copy")},
            "hard_j": {"min": min(t["j"] for t in truth if t["kind"] == "hard_negative"),
                       "max": max(t["j"] for t in truth if t["kind"] == "hard_negative")}}


# -- scoring --------------------------------------------------------------------------------------
def score(truth: list[dict], run: dict, reached: set) -> dict:
    near = run["removed"]["near"]
    standing, members = 0, {}
    for t in truth:
        if t["id"] in reached and t["kind"] in ("original", "copy") and t["j"] >= NEAR:
            members.setdefault(t["family"], []).append(t["id"])
    for fam, ids in members.items():
        standing += max(0, sum(i not in near for i in ids) - 1)
    hard = [t["id"] for t in truth if t["kind"] == "hard_negative" and t["id"] in reached]
    return {"near_copies_left_standing": standing, "cluster_members": sum(len(v) for v in members.values()),
            "false_merges": sum(i in near for i in hard), "hard_negatives": len(hard), "near_removed": len(near),
            "fuzzy_s": run["stages"]["fuzzy dedup"], "wall_s": run["wall_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--originals", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=1, help="interleaved pairs (gristmill, datatrove)")
    ap.add_argument("--out", default="/tmp/gm-dedup-heavy")
    ap.add_argument("--dt-python", default="/work/bench-venv-datatrove/bin/python")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--gm-bands-rows", type=int, nargs=2, metavar=("B", "R"))
    a = ap.parse_args()
    if not os.path.exists(a.dt_python):
        raise SystemExit(f"no datatrove venv at {a.dt_python}: create it as benchmarks/bench_vs_datatrove.py says")
    from gristmill.pipeline.langid import default_model_path

    clean = os.path.join(a.out, "clean")
    t0 = time.perf_counter()
    info = build_corpus(clean, a.originals)
    print(f"corpus: {info['documents']} documents ({info['kinds']}), {info['bytes'] / 1e6:.1f} MB, "
          f"{info['clusters']} clusters (largest {info['cluster_sizes']}), copy J min {info['copy_j']['min']:.3f} "
          f"median {info['copy_j']['median']:.3f}, hard-negative J {info['hard_j']['min']:.3f}-"
          f"{info['hard_j']['max']:.3f}; built in {time.perf_counter() - t0:.0f} s", flush=True)
    tokenizer = os.path.join(a.out, "tokenizer.json")
    if not os.path.exists(tokenizer):
        vs.train_tokenizer(clean, tokenizer)
    gm, dt = [], []
    for k in range(a.runs):
        gm.append(vs.run_gristmill(clean, os.path.join(a.out, f"gristmill-{k + 1}"), tokenizer, a.num_cpus,
                                   bands_rows=a.gm_bands_rows))
        print(f"gristmill run {k + 1}: {gm[-1]['wall_s']:.1f} s", flush=True)
        dt.append(vs.run_datatrove(a.dt_python, clean, os.path.join(a.out, f"datatrove-{k + 1}"), tokenizer,
                                   default_model_path()))
        print(f"datatrove run {k + 1}: {dt[-1]['wall_s']:.1f} s", flush=True)
    same = all(g["removed"][s] == d["removed"][s] for g in gm for d in dt for s in ("language", "exact"))
    gone = set().union(*(r["removed"]["language"] | r["removed"]["exact"] for r in gm + dt))
    reached = {t["id"] for t in info["truth"]} - gone
    res = {"corpus": {k: v for k, v in info.items() if k != "truth"}, "same_language_and_exact": same,
           "gristmill_lsh": gm[0]["lsh"], "gristmill": [score(info["truth"], r, reached) for r in gm],
           "datatrove": [score(info["truth"], r, reached) for r in dt]}
    g_f = statistics.median(s["fuzzy_s"] for s in res["gristmill"])
    d_f = statistics.median(s["fuzzy_s"] for s in res["datatrove"])
    res["fuzzy_ratio"] = d_f / g_f
    print(f"\nsame language and exact removals in both tools: {same}; {len(reached)} documents reached fuzzy dedup")
    print(f"gristmill {gm[0]['lsh']['bands']} x {gm[0]['lsh']['rows']}, datatrove {vs.BANDS} x {vs.ROWS}, threshold {vs.THRESHOLD}")
    print(f"{'':>10} {'left standing':>14} {'of members':>10} {'false merges':>12} {'of hard neg':>11} "
          f"{'near removed':>12} {'fuzzy s':>8} {'whole s':>8}")
    for tool in ("gristmill", "datatrove"):
        for s in res[tool]:
            print(f"{tool:>10} {s['near_copies_left_standing']:>14} {s['cluster_members']:>10} {s['false_merges']:>12} "
                  f"{s['hard_negatives']:>11} {s['near_removed']:>12} {s['fuzzy_s']:>8.1f} {s['wall_s']:>8.1f}")
    print(f"fuzzy dedup datatrove / gristmill: {res['fuzzy_ratio']:.1f}x")
    write_results(a.out, res)


def write_results(out: str, res: dict) -> None:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"results: {path}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
