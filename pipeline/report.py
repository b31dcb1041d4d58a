"""Per-stage statistics: the deterministic part goes into the manifest, timings into report.json.

The accounting identity every run checks (and the report prints)::

    input records = kept + sum(removed by reason) + sum(quarantined by reason)

``kept`` is the number of documents that reached the tokenizer (train + validation).
"""
from __future__ import annotations

import json
import os

import pyarrow.parquet as pq

from gristmill.errors import GristmillError


def _add(into: dict, counts: dict) -> dict:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v
    return into


def manifest_stats(extract: list[dict], global_stats: dict, tokenize: list[dict], pack: dict, global_order: list[str]) -> dict:
    """Counts only (no times, no paths): equal inputs and job give equal stats, hence equal hashes."""
    ex = {"records": 0, "documents_out": 0, "bytes_in": 0, "bytes_out": 0, "quarantined": {}}
    lg = {"documents_in": 0, "bytes_in": 0, "documents_out": 0, "bytes_out": 0, "removed": {}, "languages": {}}
    for s in extract:
        ex["records"] += s["extract"]["records"]
        ex["documents_out"] += s["extract"]["documents"]
        ex["bytes_in"] += sum(f["bytes"] for f in s["inputs"])
        ex["bytes_out"] += s["extract"]["bytes_out"]
        _add(ex["quarantined"], s["extract"]["quarantined"])
        for k in ("documents_in", "bytes_in", "documents_out", "bytes_out"):
            lg[k] += s["language"][k]
        _add(lg["removed"], s["language"]["removed"])
        _add(lg["languages"], s["language"]["languages"])
    stages = {"extract": {"documents_in": ex["records"], "documents_out": ex["documents_out"], "bytes_in": ex["bytes_in"],
                          "bytes_out": ex["bytes_out"], "quarantined": dict(sorted(ex["quarantined"].items()))},
              "language": {**lg, "removed": dict(sorted(lg["removed"].items())), "languages": dict(sorted(lg["languages"].items()))}}
    docs, nbytes = lg["documents_out"], lg["bytes_out"]
    for name in global_order:
        g = global_stats[name]
        removed = sum(g["removed"].values())
        stages[name] = {"documents_in": docs, "bytes_in": nbytes, "documents_out": docs - removed,
                        "bytes_out": nbytes - g["removed_bytes"], "removed": dict(sorted(g["removed"].items())),
                        **({"detail": g["detail"]} if g.get("detail") else {})}
        docs, nbytes = docs - removed, nbytes - g["removed_bytes"]
    tk = {"documents_in": 0, "bytes_in": 0, "documents_out": 0, "tokens_out": 0,
          "splits": {s: {"documents": 0, "tokens": 0} for s in ("train", "validation")}}
    for s in tokenize:
        for k in ("documents_in", "bytes_in", "documents_out", "tokens_out"):
            tk[k] += s[k]
        for split in tk["splits"]:
            _add(tk["splits"][split], s["splits"][split])
    stages["tokenize"] = tk
    stages["pack"] = {split: dict(v) for split, v in pack.items()}
    stages["pack"]["tokens_in"] = sum(v["tokens_in"] for v in pack.values())
    stages["pack"]["tokens_out"] = stages["pack"]["tokens_in"] - sum(v["tokens_dropped_tail"] for v in pack.values())
    removed_all = _add(dict(lg["removed"]), {})
    for name in global_order:
        _add(removed_all, global_stats[name]["removed"])
    accounting = {"input": ex["records"], "kept": tk["documents_out"], "removed": dict(sorted(removed_all.items())),
                  "quarantined": stages["extract"]["quarantined"]}
    accounting["balanced"] = accounting["input"] == accounting["kept"] + sum(removed_all.values()) + sum(ex["quarantined"].values())
    return {"stages": stages, "accounting": accounting}


class AccountingError(GristmillError):
    """[inputs, issue 26] The run's records do not add up: nothing is published."""


def check_balanced(accounting: dict, run_dir: str) -> None:
    """[inputs, issue 26] Refuse to publish a run whose accounting fails (a document lost or counted
    twice is a bug, and a version built on it would be ``latest`` with a lie in its stats). The
    accounting is written to ``<run_dir>/accounting.json`` for the bug report."""
    if accounting["balanced"]:
        return
    path = os.path.join(run_dir, "accounting.json")
    with open(path, "w") as f:
        json.dump(accounting, f, indent=1, sort_keys=True)
    removed, quarantined = sum(accounting["removed"].values()), sum(accounting["quarantined"].values())
    raise AccountingError(f"the run's accounting does not balance: input {accounting['input']:,} records != kept "
                          f"{accounting['kept']:,} + removed {removed:,} + quarantined {quarantined:,}; nothing was "
                          f"published (a gristmill bug: please report it with {path})")


def build_report(stats: dict, extract: list[dict], tokenize: list[dict], timings: dict, published, run_dir: str) -> dict:
    """report.json: the manifest stats plus time, throughput and peak memory per stage."""
    rows = []
    secs = {"extract": sum(s["extract"]["seconds"] for s in extract), "language": sum(s["language"]["seconds"] for s in extract),
            "tokenize": sum(s["seconds"] for s in tokenize)}
    for name, st in stats["stages"].items():
        if name == "pack":
            continue
        wall = timings.get(name, {}).get("seconds")
        # per-partition stages: summed task time; the others: their tasks' CPU time (core-seconds)
        cpu = secs.get(name, timings.get(name, {}).get("cpu_seconds", wall))
        mb = st.get("bytes_in", 0) / 1e6
        rows.append({"stage": name, "documents_in": st.get("documents_in"), "documents_out": st.get("documents_out"),
                     "bytes_in": st.get("bytes_in"), "tokens_out": st.get("tokens_out"),
                     "removed": sum(st.get("removed", {}).values()), "quarantined": sum(st.get("quarantined", {}).values()),
                     "core_seconds": round(cpu or 0.0, 3), "mb_per_core_s": round(mb / cpu, 3) if cpu else None,
                     "wall_seconds": round(wall, 3) if wall is not None else None,
                     "resumed_parts": timings.get(name, {}).get("resumed_parts", 0)})
    pk = stats["stages"]["pack"]
    rows.append({"stage": "pack", "documents_in": sum(v["documents"] for k, v in pk.items() if isinstance(v, dict)),
                 "tokens_out": pk["tokens_out"], "core_seconds": round(timings.get("pack", {}).get("seconds", 0.0), 3),
                 "wall_seconds": round(timings.get("pack", {}).get("seconds", 0.0), 3)})
    rows.append({"stage": "publish", "core_seconds": round(timings.get("publish", {}).get("seconds", 0.0), 3),
                 "wall_seconds": round(timings.get("publish", {}).get("seconds", 0.0), 3),
                 "shards": len(published.manifest.shards)})
    return {
        "dataset": published.manifest.dataset, "total_seconds": round(timings.get("total", {}).get("seconds", 0.0), 3), "version": published.manifest.version, "url": published.url,
        "manifest_sha256": published.manifest.sha256, "run_dir": run_dir,
        "accounting": stats["accounting"], "stages": rows,
        "peak_rss_mb_per_worker": {"extract": max((s.get("peak_rss_mb", 0) for s in extract), default=0),
                                   "tokenize": max((s.get("peak_rss_mb", 0) for s in tokenize), default=0)},
        "quarantine": os.path.join(run_dir, "quarantine.jsonl"), "removed": os.path.join(run_dir, "removed.jsonl"),
        "stats": stats["stages"],
    }


def format_table(report: dict) -> str:
    head = f"{'stage':<14}{'docs in':>10}{'docs out':>10}{'removed':>9}{'quarant.':>9}{'MB in':>9}{'tokens':>12}{'core s':>8}{'MB/s/core':>10}{'wall s':>8}"
    lines = [head, "-" * len(head)]
    for r in report["stages"]:
        def f(k, fmt="{:,}"):
            v = r.get(k)
            return "" if v is None else fmt.format(v)
        mb = "" if r.get("bytes_in") is None else f"{r['bytes_in'] / 1e6:,.2f}"
        lines.append(f"{r['stage']:<14}{f('documents_in'):>10}{f('documents_out'):>10}{f('removed'):>9}{f('quarantined'):>9}"
                     f"{mb:>9}{f('tokens_out'):>12}{f('core_seconds', '{:.2f}'):>8}{f('mb_per_core_s', '{:.2f}'):>10}"
                     f"{f('wall_seconds', '{:.1f}'):>8}")
    a = report["accounting"]
    lines.append(f"input {a['input']:,} = kept {a['kept']:,} + removed {sum(a['removed'].values()):,} {a['removed']} "
                 f"+ quarantined {sum(a['quarantined'].values()):,} {a['quarantined']}  [{'OK' if a['balanced'] else 'MISMATCH'}]")
    lines.append(f"published {report['dataset']} v{report['version']}  sha256 {report['manifest_sha256']}")
    lines.append(f"           {report['url']}")
    return "\n".join(lines)


def export_jsonl(parquet_files: list[str], out_path: str, drop: tuple[str, ...] = ()) -> int:
    """Concatenate bookkeeping parquet files (quarantine, removed) into one JSONL, in order,
    less the ``drop`` columns."""
    n = 0
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        for p in parquet_files:
            if not os.path.exists(p):
                continue
            pf = pq.ParquetFile(p)
            columns = [c for c in pf.schema_arrow.names if c not in drop]
            for batch in pf.iter_batches(batch_size=4096, columns=columns):
                for row in batch.to_pylist():
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    n += 1
    os.replace(tmp, out_path)
    return n
