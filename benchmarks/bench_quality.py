"""The quality stage's rules against datatrove 0.10.x's filters on the same documents (issue 19).

    .venv/bin/python benchmarks/bench_quality.py [--scale 30] [--out /tmp/gm-quality] [--limit N]

Start it without flock: it takes /tmp/gristmill-heavy.lock itself around the timed part (the
wait is not timed). datatrove lives in its own venv (see bench_vs_datatrove.py; ``--dt-python``).

Documents: every good record of the demo corpus at ``--scale`` (``gristmill demo-corpus``), read
with gristmill's own readers (JSONL, Parquet ``content``, text, WARC main content), stripped, at
most 100,000 characters: what the quality stage receives when language ID and dedup are off.
Both tools get the same ``docs.jsonl``.

Work, one process per tool, interleaved under the lock: gristmill ``pipeline.quality.evaluate``
with the default ``quality:`` section (all four rule sets, every metric on every document);
datatrove ``GopherRepetitionFilter``, ``GopherQualityFilter``, ``C4QualityFilter`` and
``FineWebQualityFilter`` with their defaults, each run on every document (no short cut after a
removal, like gristmill), FineWeb on the text C4 left (datatrove's C4 rewrites ``doc.text``).
Timed: CPU seconds of the per-document loop (process_time), after one warm-up document
(spaCy and numba load outside the clock). Reported: documents per CPU-second of each, the
ratio, and per rule set and per rule the agreement: for each rule R, on how many documents
both tools' first failing rule of that set is R, only datatrove's, only gristmill's; a rule
set's keep/remove agreement. FineWeb is compared on the documents both tools' C4 kept (its
input text is C4's output). Results: OUT/result.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

SETS = ("gopher_repetition", "gopher_quality", "c4", "fineweb")

# datatrove's reason strings -> gristmill's rule names
DT_REASONS = {
    "gopher_quality": {"gopher_short_doc": "word_count", "gopher_long_doc": "word_count",
                       "gopher_below_avg_threshold": "mean_word_length", "gopher_above_avg_threshold": "mean_word_length",
                       "gopher_too_many_hashes": "hash_ratio", "gopher_too_many_ellipsis": "ellipsis_ratio",
                       "gopher_too_many_bullets": "bullet_lines", "gopher_too_many_end_ellipsis": "ellipsis_lines",
                       "gopher_below_alpha_threshold": "alpha_words", "gopher_enough_stop_words": "stop_words"},
    "gopher_repetition": {**{k: k for k in ("dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac")},
                          **{f"top_{n}_gram": f"top_{n}_gram" for n in (2, 3, 4)},
                          **{f"duplicated_{n}_n_grams": f"dup_{n}_gram" for n in range(5, 11)}},
    "c4": {"lorem_ipsum": "lorem_ipsum", "curly_bracket": "curly_bracket", "too_few_sentences": "sentences"},
    "fineweb": {k: k for k in ("line_punct_ratio", "short_line_ratio", "char_dup_ratio", "list_ratio", "empty")},
}


def write_docs(scale: int, out: str, limit: int | None) -> str:
    from gristmill.pipeline.demo_corpus import write_demo_corpus
    from gristmill.pipeline.readers import read_records

    corpus = os.path.join(out, f"demo-{scale}")
    if not os.path.exists(os.path.join(corpus, "corpus")):
        write_demo_corpus(corpus, scale=scale)
    path = os.path.join(out, f"docs-{scale}.jsonl")
    n = 0
    with open(path, "w") as f:
        for uri in sorted(glob.glob(os.path.join(corpus, "corpus", "*"))):
            fmt = ("warc" if ".warc" in uri else "jsonl" if ".jsonl" in uri else "parquet" if uri.endswith(".parquet")
                   else "text")
            for rec in read_records(uri, fmt, "content" if fmt == "parquet" else "text"):
                text = rec.get("text", "")
                if "reason" in rec or not isinstance(text, str):
                    continue
                text = text.strip()
                try:
                    text.encode()
                except UnicodeEncodeError:
                    continue
                if 0 < len(text) <= 100_000 and (limit is None or n < limit):
                    f.write(json.dumps({"id": f"{os.path.basename(uri)}:{rec['position']}", "text": text}) + "\n")
                    n += 1
    return path


def gristmill_main(docs: str, result: str) -> None:
    from gristmill.pipeline.quality import evaluate, rule_sets
    from gristmill.pipeline.stages.quality.config import QualityConfig

    cfg = QualityConfig()
    rows = [json.loads(line) for line in open(docs)]
    evaluate(rows[0]["text"], cfg)  # numba kernels load outside the clock
    c0 = time.process_time()
    verdicts = [evaluate(r["text"], cfg) for r in rows]
    cpu = time.process_time() - c0
    sets = rule_sets(cfg)
    out = []
    for r, v in zip(rows, verdicts):
        reasons = {}
        for name, rules, sub, *_ in sets:
            reasons[name] = next((rule.name.split(":", 1)[1] for rule in rules
                                  if rule.verdict(v.metrics[rule.name], sub) is not None), None)
        out.append({"id": r["id"], **reasons})
    json.dump({"cpu_seconds": cpu, "docs": len(rows), "verdicts": out}, open(result, "w"))


def datatrove_main(docs: str, result: str) -> None:
    from datatrove.data import Document
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                            GopherRepetitionFilter)

    filters = [("gopher_repetition", GopherRepetitionFilter()), ("gopher_quality", GopherQualityFilter()),
               ("c4", C4QualityFilter()), ("fineweb", FineWebQualityFilter())]
    rows = [json.loads(line) for line in open(docs)]

    def run(r):
        doc = Document(text=r["text"], id=r["id"])
        reasons = {}
        for name, f in filters:
            v = f.filter(doc)  # C4 rewrites doc.text when it keeps the document: FineWeb sees that
            reasons[name] = None if v is True else (v[1] if isinstance(v, tuple) else "removed")
        return {"id": r["id"], **reasons}

    run(rows[0])  # spaCy loads outside the clock
    c0 = time.process_time()
    out = [run(r) for r in rows]
    cpu = time.process_time() - c0
    json.dump({"cpu_seconds": cpu, "docs": len(rows), "verdicts": out}, open(result, "w"))


def agreement(gm: list[dict], dt: list[dict]) -> dict:
    res = {}
    for s in SETS:
        pairs = [(g[s], DT_REASONS[s].get(d[s], d[s]) if d[s] is not None else None) for g, d in zip(gm, dt)
                 if s != "fineweb" or (g["c4"] is None and d["c4"] is None)]
        rules = sorted({x for p in pairs for x in p if x is not None})
        per_rule = {}
        for rule in rules:
            both = sum(g == rule and d == rule for g, d in pairs)
            only_dt = sum(g != rule and d == rule for g, d in pairs)
            only_gm = sum(g == rule and d != rule for g, d in pairs)
            per_rule[rule] = {"both": both, "only_datatrove": only_dt, "only_gristmill": only_gm,
                              "agreement": round(1 - (only_dt + only_gm) / len(pairs), 4)}
        same = sum((g is None) == (d is None) for g, d in pairs)
        res[s] = {"documents": len(pairs), "removed_gristmill": sum(g is not None for g, _ in pairs),
                  "removed_datatrove": sum(d is not None for _, d in pairs),
                  "keep_remove_agreement": round(same / len(pairs), 4) if pairs else None, "rules": per_rule}
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("_gristmill", "_datatrove"):
        (gristmill_main if sys.argv[1] == "_gristmill" else datatrove_main)(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=int, default=30)
    ap.add_argument("--limit", type=int, help="at most this many documents")
    ap.add_argument("--out", default="/tmp/gm-quality")
    ap.add_argument("--dt-python", default="/work/bench-venv-datatrove/bin/python")
    a = ap.parse_args()
    from bench_vs_datatrove import heavy_lock  # the script's own folder is on sys.path

    os.makedirs(a.out, exist_ok=True)
    docs = write_docs(a.scale, a.out, a.limit)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {}
    with heavy_lock():
        for tool, python in (("gristmill", sys.executable), ("datatrove", a.dt_python)):
            res = os.path.join(a.out, f"{tool}.json")
            t0 = time.perf_counter()
            subprocess.run([python, os.path.abspath(__file__), f"_{tool}", docs, res], check=True, env=env)
            runs[tool] = {**json.load(open(res)), "wall_seconds": time.perf_counter() - t0}
    gm, dt = runs["gristmill"], runs["datatrove"]
    rate = {t: r["docs"] / r["cpu_seconds"] for t, r in runs.items()}
    summary = {"scale": a.scale, "documents": gm["docs"],
               "cpu_seconds": {t: round(r["cpu_seconds"], 2) for t, r in runs.items()},
               "docs_per_cpu_second": {t: round(v, 1) for t, v in rate.items()},
               "ratio": round(rate["gristmill"] / rate["datatrove"], 2),
               "agreement": agreement(gm["verdicts"], dt["verdicts"])}
    json.dump(summary, open(os.path.join(a.out, "result.json"), "w"), indent=1)
    print(f"{gm['docs']:,} documents (demo scale {a.scale})")
    for t in runs:
        print(f"  {t:<10} {runs[t]['cpu_seconds']:8.2f} CPU s  {rate[t]:9,.1f} docs/CPU-s")
    print(f"  gristmill / datatrove: {summary['ratio']:.2f}x")
    for s, r in summary["agreement"].items():
        print(f"{s}: {r['documents']:,} docs, removed gristmill {r['removed_gristmill']:,} datatrove "
              f"{r['removed_datatrove']:,}, keep/remove agreement {r['keep_remove_agreement']}")
        for rule, x in r["rules"].items():
            print(f"    {rule:<20} both {x['both']:>6,}  only datatrove {x['only_datatrove']:>6,}  "
                  f"only gristmill {x['only_gristmill']:>6,}  agreement {x['agreement']}")


if __name__ == "__main__":
    main()
