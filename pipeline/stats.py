"""Per-stage statistics: the deterministic part goes into the manifest, timings into report.json.

The accounting identity every run checks (and the report prints)::

    input records = kept + sum(removed by reason) + sum(quarantined by reason)

``kept`` is the number of documents that reached the tokenizer (train + validation).
"""
from __future__ import annotations

import difflib
import functools
import json
import os
from dataclasses import dataclass, field
from typing import Iterable

import pyarrow as pa

from gristmill.errors import GristmillError


FLOW_KEYS = ("documents_in", "bytes_in", "removed", "removed_bytes")  # Counts' fields in a task's stats
NOT_FLOW_KEYS = ("documents_out", "bytes_out")  # the rows' own fields, close to a flow field's name by design


@functools.lru_cache(maxsize=1024)
def _near_flow_key(key: str) -> str | None:
    """The flow field ``key`` nearly spells (not being one, nor a row's own field), else None. Cached:
    every task's stats go through ``Counts.of_task``, and their keys are the same few names."""
    if key in FLOW_KEYS or key in NOT_FLOW_KEYS:
        return None
    return next(iter(difflib.get_close_matches(key, FLOW_KEYS, 1, 0.8)), None)


@dataclass
class Counts:
    """One task's or one stage's flow counts: documents and bytes in, removed by reason. Tasks of
    a document-flow stage return these fields in their stats; ``Counts.of_tasks`` merges them."""

    documents_in: int = 0
    bytes_in: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    removed_bytes: int = 0

    @classmethod
    def of_task(cls, stats: dict) -> "Counts":
        """A task's flow counts (absent fields count zero). A key that is nearly a flow field's name
        is refused: a misspelt ``removed_byte`` would otherwise count zero without a word."""
        for key in stats:
            if near := _near_flow_key(key):
                raise ValueError(f"a task's stats hold {key!r}, close to the flow field {near!r} but not it (flow "
                                 f"fields: {', '.join(FLOW_KEYS)}): a misspelt field would count zero")
        return cls(int(stats.get("documents_in", 0)), int(stats.get("bytes_in", 0)), dict(stats.get("removed", {})),
                   int(stats.get("removed_bytes", 0)))

    @classmethod
    def of_tasks(cls, stats: Iterable[dict]) -> "Counts":
        total = cls()
        for s in stats:
            total = total + cls.of_task(s)
        return total

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.documents_in + other.documents_in, self.bytes_in + other.bytes_in,
                      summed([self.removed, other.removed]), self.removed_bytes + other.removed_bytes)


@dataclass
class Accounting:
    """A stage's part of ``input = kept + removed + quarantined``; the executor adds them up."""

    input: int = 0
    kept: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)

    def __add__(self, other: "Accounting") -> "Accounting":
        return Accounting(self.input + other.input, self.kept + other.kept, summed([self.removed, other.removed]),
                          summed([self.quarantined, other.quarantined]))

    def to_dict(self) -> dict:
        return {"input": self.input, "kept": self.kept, "removed": self.removed, "quarantined": self.quarantined,
                "balanced": self.input == self.kept + sum(self.removed.values()) + sum(self.quarantined.values())}


def summed(records: Iterable[dict], keys: Iterable[str] | None = None) -> dict:
    """Field-wise sum of JSON-able stats records (numbers add, nested dicts merge and add, keys
    sorted); only ``keys`` when given. The one way stats are summed."""
    out: dict = {}
    for r in records:
        for k in (r if keys is None else keys):
            v = r[k]
            if isinstance(v, dict):
                out[k] = summed([out.get(k, {}), v])
            else:
                out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))


def manifest_stats(results: list) -> dict:
    """The manifest's statistics from the stages' results, in stage order. Counts only (no times,
    no paths): equal inputs and job give equal stats, hence equal hashes. A stage's own rows
    (``StageResult.rows``) go in as they are; a stage in the document flow (``StageResult.flow``)
    gets a row whose documents in are the previous flow row's out."""
    stages: dict[str, dict] = {}
    accounting = Accounting()
    docs = nbytes = 0
    for r in results:
        for name, row in r.rows.items():
            stages[name] = row
        if r.flow_start is not None:
            docs, nbytes = r.flow_start
        if r.flow is not None:
            g, removed = r.flow, sum(r.flow.removed.values())
            stages[r.name] = {"documents_in": docs, "bytes_in": nbytes, "documents_out": docs - removed,
                              "bytes_out": nbytes - g.removed_bytes, "removed": dict(sorted(g.removed.items())),
                              **({"detail": r.detail} if r.detail else {})}
            docs, nbytes = docs - removed, nbytes - g.removed_bytes
            accounting = accounting + Accounting(removed=g.removed)
        accounting = accounting + r.accounting
    return {"stages": stages, "accounting": accounting.to_dict()}



class AccountingError(GristmillError):
    """The run's records do not add up: nothing is published."""


def check_balanced(accounting: dict, wd) -> None:
    """Refuse to publish a run whose accounting fails (a document lost or counted twice is a bug,
    and a version built on it would be ``latest`` with a lie in its stats). The accounting is
    written to ``<run_dir>/accounting.json`` for the bug report."""
    if accounting["balanced"]:
        return
    path = wd.accounting_json
    try:
        wd.store.put(path, (json.dumps(accounting, indent=1, sort_keys=True) + "\n").encode())
        where = f"with {path}"
    except OSError as e:  # the error to report is the accounting's, not this write's
        where = f"(writing {path} failed too: {type(e).__name__}: {e}): {json.dumps(accounting, sort_keys=True)}"
    removed, quarantined = sum(accounting["removed"].values()), sum(accounting["quarantined"].values())
    raise AccountingError(f"the run's accounting does not balance: input {accounting['input']:,} records != kept "
                          f"{accounting['kept']:,} + removed {removed:,} + quarantined {quarantined:,}; nothing was "
                          f"published (a gristmill bug: please report it {where})")

def build_report(stats: dict, core_seconds: dict, peak_rss_mb: dict, timings: dict, published, wd) -> dict:
    """report.json: the manifest stats plus time, throughput and peak memory per stage.

    ``core_seconds``: a row's summed task seconds where its stage measured them (per-partition
    stages); other rows take their tasks' CPU time (core-seconds) from ``timings``."""
    rows = []
    for name, st in stats["stages"].items():
        wall = timings.get(name, {}).get("seconds")
        if "documents_in" not in st:  # a row per split (packing): documents and tokens only
            rows.append({"stage": name, "documents_in": sum(v["documents"] for v in st.values() if isinstance(v, dict)),
                         "tokens_out": st["tokens_out"], "core_seconds": round(wall or 0.0, 3),
                         "wall_seconds": round(wall or 0.0, 3)})
            continue
        cpu = core_seconds.get(name, timings.get(name, {}).get("cpu_seconds", wall))
        mb = st.get("bytes_in", 0) / 1e6
        rows.append({"stage": name, "documents_in": st.get("documents_in"), "documents_out": st.get("documents_out"),
                     "bytes_in": st.get("bytes_in"), "tokens_out": st.get("tokens_out"),
                     "removed": sum(st.get("removed", {}).values()), "quarantined": sum(st.get("quarantined", {}).values()),
                     "core_seconds": round(cpu or 0.0, 3), "mb_per_core_s": round(mb / cpu, 3) if cpu else None,
                     "wall_seconds": round(wall, 3) if wall is not None else None,
                     "resumed_parts": timings.get(name, {}).get("resumed_parts", 0)})
    rows.append({"stage": "publish", "core_seconds": round(timings.get("publish", {}).get("seconds", 0.0), 3),
                 "wall_seconds": round(timings.get("publish", {}).get("seconds", 0.0), 3),
                 "shards": len(published.manifest.shards)})
    return {
        "dataset": published.manifest.dataset, "total_seconds": round(timings.get("total", {}).get("seconds", 0.0), 3),
        "version": published.manifest.version, "url": published.url,
        "manifest_sha256": published.manifest.sha256, "run_dir": wd.root,
        "accounting": stats["accounting"], "stages": rows, "peak_rss_mb_per_worker": peak_rss_mb,
        "quarantine": wd.quarantine_jsonl, "removed": wd.removed_jsonl,
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


def export_jsonl(wd, parquet_files: list[str], out_path: str, drop: tuple[str, ...] = ()) -> int:
    """Concatenate bookkeeping parquet files (quarantine, removed) of the run dir ``wd`` into one
    JSONL there, in order, less the ``drop`` columns."""
    n = 0
    with wd.store.open_put(out_path) as f:  # whole or not at all
        for p in parquet_files:
            if not wd.exists(p):
                continue
            with wd.open_parquet(p) as pf:
                columns = [c for c in pf.schema_arrow.names if c not in drop]
                # on this thread: Arrow's decoding threads would each keep an allocator arena in the
                # driver (+25 MB of RSS at 200 MB of input, growing with it; issue 32, target 5)
                for batch in pf.iter_batches(batch_size=4096, columns=columns, use_threads=False):
                    f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in batch.to_pylist()).encode())
                    n += batch.num_rows
    pa.default_memory_pool().release_unused()  # what the reads freed goes back to the system, not kept for later
    return n
