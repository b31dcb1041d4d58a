"""Decontamination throughput: documents/s on one core against a realistic eval index.

Side by side in one run, on the same ~3 KB documents and the same eval items:
  - gristmill: ``NgramIndex.scan`` on batches of 512 (what each Ray worker runs);
  - naive: ``words()``, then every 13-gram joined into a string and looked up in a Python set;
  - ``pipeline.text.normalize`` alone, per document (what any method built on ``words()`` pays
    before its first lookup; gristmill's scan skips its regex for ASCII documents).
Both must flag exactly the same documents. Optionally (--ray) the whole stage: the table API
``decontaminate(table, cfg, work_dir)`` in one process, and the executor's map (a Ray task per
partition file, 2 CPUs).

    python benchmarks/bench_decontam.py [--docs 2000] [--items 4500] [--non-ascii 0.0] [--repeat 3] [--ray]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from gristmill.pipeline.ngrams import DEFAULT_N, build_index
from gristmill.pipeline.text import normalize, words


def vocabulary(rng, size=30_000):
    """Word-like tokens with an English-like (Zipf) frequency: common words dominate."""
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    lengths = rng.integers(2, 10, size=size)
    vocab = np.array(["".join(rng.choice(letters, size=n)) for n in lengths])
    weights = 1.0 / np.arange(1, size + 1)
    return vocab, weights / weights.sum()


def sentence(rng, vocab, p, k):
    ws = rng.choice(vocab, size=k, p=p)
    return " ".join(ws).capitalize() + "."


def make_data(docs: int, items: int, seed: int = 0, non_ascii: float = 0.0):
    """Eval items of ~36 words; ~3 KB documents, 1% with an eval item pasted in; a fraction
    ``non_ascii`` of documents get curly quotes (as web text often has), which takes the
    scan off its ASCII fast path."""
    rng = np.random.default_rng(seed)
    vocab, p = vocabulary(rng)
    evals = [(f"q{i}", " ".join(sentence(rng, vocab, p, 12) for _ in range(3))) for i in range(items)]  # ~36 words
    texts = []
    for d in range(docs):
        parts = [sentence(rng, vocab, p, int(rng.integers(8, 25))) for _ in range(28)]  # ~3 KB
        if d % 100 == 0:  # 1% contaminated
            parts.insert(len(parts) // 2, evals[d % items][1])
        if rng.random() < non_ascii:
            parts[0] = f"\u201c{parts[0]}\u201d"
        texts.append(" ".join(parts))
    return evals, texts


def naive_index(evals, n):
    grams = set()
    for _, text in evals:
        ws = words(text)
        grams.update(" ".join(ws[i:i + n]) for i in range(max(1, len(ws) - n + 1)))
    return grams


def naive_flags(grams, texts, n):
    out = []
    for text in texts:
        ws = words(text)
        out.append(any(" ".join(ws[i:i + n]) in grams for i in range(len(ws) - n + 1)))
    return out


def timed(fn, repeat=1):
    """Best of ``repeat`` runs: the least disturbed by other work on a shared machine."""
    return race({"": fn}, repeat)[""]


def race(fns: dict, repeat: int) -> dict:
    """Best CPU time and result of each function. CPU seconds of this (single-threaded) process
    are per-core time, far less disturbed than wall time by other work on a shared machine;
    the runs are interleaved (A B C A B C ...) so whatever disturbance is left hits all alike."""
    best = {name: (float("inf"), None) for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.process_time()
            result = fn()
            best[name] = (min(best[name][0], time.process_time() - t), result)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--items", type=int, default=4500)
    ap.add_argument("--n", type=int, default=DEFAULT_N)
    ap.add_argument("--non-ascii", type=float, default=0.0, help="fraction of documents with curly quotes")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs per method; the best counts")
    ap.add_argument("--ray", action="store_true", help="also time the whole stage: table API, and a Ray task per partition (2 CPUs)")
    args = ap.parse_args(argv)

    evals, texts = make_data(args.docs, args.items, non_ascii=args.non_ascii)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    t_build, index = timed(lambda: build_index([("bench", evals)], args.n))
    t_set, grams = timed(lambda: naive_index(evals, args.n))
    print(f"eval index: {len(evals)} items, {index.ngrams} distinct {args.n}-grams; "
          f"built in {t_build:.2f} s (naive set: {t_set:.2f} s)")
    index_mb = (index.hashes.nbytes + index.owners.nbytes + index.owner_ptr.nbytes) / 1e6
    set_mb = (sys.getsizeof(grams) + sum(sys.getsizeof(g) for g in grams)) / 1e6
    print(f"index memory: {index_mb:.1f} MB (naive set of strings: {set_mb:.1f} MB)")
    print(f"documents: {len(texts)}, {mb:.1f} MB, mean {mb * 1e6 / len(texts):.0f} bytes")

    runs = race({"norm": lambda: [normalize(t) for t in texts],
                 "ours": lambda: [m for i in range(0, len(texts), 512) for m in index.scan(texts[i:i + 512])],
                 "naive": lambda: naive_flags(grams, texts, args.n)}, repeat=args.repeat)
    (t_norm, _), (t_ours, matches), (t_naive, flags) = runs["norm"], runs["ours"], runs["naive"]
    ours = [bool(m) for m in matches]
    assert ours == flags, "gristmill and the naive baseline disagree on which documents are contaminated"
    print(f"flagged: {sum(ours)} documents (both methods agree)")
    print("| method (one core, CPU time) | docs/s | MB/s | vs naive |")
    print("|---|---:|---:|---:|")
    for name, t in (("gristmill NgramIndex.scan", t_ours), ("naive Python set of 13-gram strings", t_naive),
                    ("pipeline.text.normalize alone (reference)", t_norm)):
        print(f"| {name} | {len(texts) / t:,.0f} | {mb / t:.1f} | {t_naive / t:.2f}x |")

    if args.ray:
        stage_throughput(texts, evals, args.n)
    return 0


def stage_throughput(texts, evals, n, docs_per_part: int = 500):
    """The whole stage two ways, index cached in the work dir (second run each, workers warm):
    the table API ``decontaminate(table, cfg, work_dir)`` in this process, and the executor's
    map: a Ray task per partition file (``partition_task``) on 2 CPUs."""
    import functools
    import json
    import os
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from gristmill.pipeline.stages.decontaminate.config import DecontamConfig
    from gristmill.pipeline.stages.decontaminate.tasks import (build_eval_index, decontaminate, eval_index_path,
                                                               load_eval_sets, partition_task)
    from gristmill.pipeline.documents import make_order
    from gristmill.pipeline.runners.ray import RayRunner
    from gristmill.pipeline.survivors import Survivors
    from gristmill.pipeline.workdir import ParquetPart, WorkDir, part_name

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps({"id": i, "text": t}) + "\n" for i, t in evals)
        cfg = DecontamConfig.from_dict({"n": n, "eval_sets": [{"name": "bench", "path": path, "id_field": "id"}]})
        table = pa.Table.from_pylist([{"id": str(i), "order": i, "text": t, "source": "bench", "position": i}
                                      for i, t in enumerate(texts)])
        decontaminate(table, cfg, tmp)  # caches the index
        t = time.perf_counter()
        removed = decontaminate(table, cfg, tmp).removed.num_rows
        dt = time.perf_counter() - t
        print(f"table API, one process: {len(texts) / dt:,.0f} docs/s end to end ({removed} removed, {dt:.2f} s)")

        # The executor's stage: partition files (the columns extract writes that the task reads).
        files = []
        for p, start in enumerate(range(0, len(texts), docs_per_part)):
            chunk = texts[start:start + docs_per_part]
            out = ParquetPart(os.path.join(tmp, "docs", f"{part_name(p)}.parquet"),
                              pa.schema([("id", pa.string()), ("order", pa.int64()), ("part", pa.int32()), ("bytes", pa.int64()),
                                         ("source", pa.string()), ("position", pa.int64()), ("text", pa.string())]))
            out.write(pa.table({"id": [str(start + i) for i in range(len(chunk))],
                                "order": pa.array([make_order(p, i) for i in range(len(chunk))], pa.int64()),
                                "part": pa.array([p] * len(chunk), pa.int32()), "bytes": [len(x.encode()) for x in chunk],
                                "source": ["bench"] * len(chunk), "position": list(range(start, start + len(chunk))),
                                "text": chunk}))
            out.commit()
            files.append(out.path)
        loaded = load_eval_sets(cfg)
        build_eval_index(cfg, loaded, tmp)
        index_path = eval_index_path(cfg, loaded, tmp)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            for attempt in ("warm-up", "timed"):  # a fresh work dir each: markers would skip finished tasks
                wd = WorkDir(os.path.join(tmp, attempt))
                for f in files:
                    os.makedirs(os.path.dirname(wd.docs(0)), exist_ok=True)
                    os.symlink(f, os.path.join(os.path.dirname(wd.docs(0)), os.path.basename(f)))
                items = [{"name": part_name(p), "part": p} for p in range(len(files))]
                fn = functools.partial(partition_task, cfg=cfg, index_path=index_path, survivors=Survivors(wd))
                t = time.perf_counter()
                RayRunner(ray, wd).run("decontaminate", items, fn)
                dt = time.perf_counter() - t
            removed = sum(pq.read_metadata(wd.removed("decontaminate", p)).num_rows for p in range(len(files)))
        finally:
            ray.shutdown()
    print(f"executor's map, a Ray task per partition ({len(files)} of {docs_per_part} docs), 2 CPUs: "
          f"{len(texts) / dt:,.0f} docs/s end to end ({removed} removed, {dt:.2f} s)")


if __name__ == "__main__":
    sys.exit(main())
