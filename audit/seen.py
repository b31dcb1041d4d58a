"""`audit seen`: the rows, documents and tokens a checkpoint's model was trained on.

The consumed ``(shard, row)`` pairs are turned into one integer key per row (the row's
position in the concatenation of ``manifest.shards``); the document index, sorted by
``(shard, row, start)``, gets the same key, and a sorted search joins the two. No Python loop
runs per sample or per span, so a million sequences take about a second (benchmarks/bench_audit.py).
"""
from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.manifests import Manifest, Published
from gristmill.manifests.doc_index import read_published_doc_index, row_offsets  # noqa: F401  (row_offsets: audit's import point)
from gristmill.manifests.runs import run_starts
from gristmill.manifests.storage import split_url

from .consumed import Consumed

DOC_COLUMNS = ["shard", "row", "start", "length", "doc_id", "source", "position", "lang", "url"]


def read_spans(published: Published, columns: list[str] | None = None, filters=None) -> pa.Table:
    """The document index the manifest pins, read once and hash-checked: the join is only as good as the index."""
    return read_published_doc_index(published, columns=columns or DOC_COLUMNS, filters=filters)


@dataclass(frozen=True)
class RowUse:
    """Per distinct consumed row: its key, how often it was consumed, first and last step."""

    key: np.ndarray
    times: np.ndarray
    first_step: np.ndarray
    last_step: np.ndarray

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit mask, position in this table) for arbitrary row keys."""
        pos = np.searchsorted(self.key, keys)
        pos = np.minimum(pos, max(len(self.key) - 1, 0))
        hit = (self.key[pos] == keys) if len(self.key) else np.zeros(len(keys), bool)
        return hit, pos


def row_use(manifest: Manifest, used: Consumed) -> RowUse:
    keys = row_offsets(manifest)[used.shard] + used.row
    # One stable sort: equal keys stay in training order, so each run's ends are its first and last use.
    order = np.argsort(keys, kind="stable")
    starts = np.flatnonzero(run_starts(keys[order]))
    ends = np.append(starts[1:], len(keys)) - 1
    return RowUse(key=keys[order][starts], times=ends - starts + 1, first_step=used.step[order[starts]],
                  last_step=used.step[order[ends]])


def seen_spans(manifest: Manifest, spans: pa.Table, use: RowUse) -> pa.Table:
    """The document index with, per span, how often its row was consumed and first/last step."""
    keys = row_offsets(manifest)[spans.column("shard").to_numpy()] + spans.column("row").to_numpy()
    hit, pos = use.lookup(keys)
    times = np.where(hit, use.times[pos], 0)
    length = spans.column("length").to_numpy().astype(np.int64)
    return spans.append_column("times_seen", pa.array(times, pa.int64())) \
        .append_column("tokens_seen", pa.array(np.where(hit, length, 0), pa.int64())) \
        .append_column("token_exposures", pa.array(length * times, pa.int64())) \
        .append_column("first_step", pa.array(use.first_step[pos], pa.int64(), mask=~hit)) \
        .append_column("last_step", pa.array(use.last_step[pos], pa.int64(), mask=~hit))


DOC_SCHEMA = pa.schema([
    ("doc_id", pa.string()), ("source", pa.string()), ("position", pa.int64()), ("lang", pa.string()),
    ("tokens", pa.int64()), ("tokens_seen", pa.int64()), ("fully_seen", pa.bool_()), ("times_seen", pa.int64()),
    ("token_exposures", pa.int64()), ("first_step", pa.int64()), ("last_step", pa.int64()),
])


def seen_documents(spans: pa.Table) -> pa.Table:
    """One row per document with at least one consumed span: tokens seen of tokens total.

    Spans are grouped by an integer code per doc_id (one hash pass), then summed with
    ``reduceat`` over a stable sort of the codes: no per-document Python, no string sort.
    Output order: first step seen, then position in the document index (deterministic).
    """
    if spans.num_rows == 0:
        return DOC_SCHEMA.empty_table()
    codes = pc.dictionary_encode(spans.column("doc_id")).combine_chunks().indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    starts = np.flatnonzero(run_starts(codes[order]))

    def per_doc(ufunc, name, fill=0):
        return ufunc.reduceat(pc.fill_null(spans.column(name), fill).to_numpy().astype(np.int64)[order], starts)

    agg = {"tokens": per_doc(np.add, "length"), "tokens_seen": per_doc(np.add, "tokens_seen"),
           "times_seen": per_doc(np.maximum, "times_seen"), "token_exposures": per_doc(np.add, "token_exposures"),
           "first_step": per_doc(np.minimum, "first_step", np.iinfo(np.int64).max),
           "last_step": per_doc(np.maximum, "last_step", -1)}
    agg["fully_seen"] = agg["tokens_seen"] == agg["tokens"]
    keep = np.flatnonzero(agg["tokens_seen"] > 0)
    first_span = order[starts]  # each document's first span in index order
    keep = keep[np.lexsort((first_span[keep], agg["first_step"][keep]))]
    docs = {name: spans.column(name).take(first_span[keep]) for name in ("doc_id", "source", "position", "lang")}
    docs.update({name: values[keep] for name, values in agg.items()})
    return pa.table({f.name: docs[f.name] for f in DOC_SCHEMA}).cast(DOC_SCHEMA)


def source_of(uri: str, config: dict) -> str:
    """The pipeline input a file came from: the first ``inputs[].path`` glob of the job that matches it,
    else the file's directory (datasets not made by ``gristmill prepare``)."""
    specs = config.get("inputs") if isinstance(config, dict) else None
    for spec in specs if isinstance(specs, list) else ():
        pattern = spec.get("path") if isinstance(spec, dict) else None
        if isinstance(pattern, str) and (uri == pattern or fnmatch.fnmatchcase(uri, pattern)
                                         or fnmatch.fnmatchcase(split_url(uri)[1], split_url(pattern)[1])):
            return pattern
    return posixpath.dirname(uri)


def _by(docs: pa.Table, key: str) -> dict:
    g = docs.group_by(key, use_threads=False).aggregate([
        ("doc_id", "count"), ("fully_seen", "sum"), ("tokens_seen", "sum"), ("token_exposures", "sum")])
    out = {}
    for r in sorted(g.to_pylist(), key=lambda r: (r[key] is None, str(r[key]))):
        out[str(r[key]) if r[key] is not None else "unknown"] = {
            "documents": r["doc_id_count"], "fully_seen": int(r["fully_seen_sum"] or 0),
            "tokens_seen": int(r["tokens_seen_sum"]), "token_exposures": int(r["token_exposures_sum"])}
    return out


def summarize(published: Published, used: Consumed, use: RowUse, docs: pa.Table, steps: tuple[int, int]) -> dict:
    """The JSON-able answer: totals, per shard, per source directory, per input file, per language."""
    m = published.manifest
    offsets = row_offsets(m)
    shard_of_key = np.searchsorted(offsets, use.key, side="right") - 1
    per_shard = {}
    for s in np.unique(shard_of_key):
        sel = shard_of_key == s
        per_shard[m.shards[s].path] = {"rows_seen": int(sel.sum()), "rows": m.shards[s].rows,
                                       "samples": int(use.times[sel].sum())}
    inputs = {i.uri: i.sha256 for i in m.inputs}
    by_file = _by(docs, "source")
    by_source: dict[str, dict] = {}
    for uri, entry in by_file.items():
        entry["input_sha256"] = inputs.get(uri)
        group = by_source.setdefault(source_of(uri, m.config), {k: 0 for k in entry if k != "input_sha256"})
        for k in group:
            group[k] += entry[k]
    n_docs = docs.num_rows
    n_full = int(pc.sum(docs.column("fully_seen")).as_py() or 0)
    return {
        "dataset": m.dataset, "version": m.version, "manifest_sha256": m.sha256, "manifest_url": published.url,
        "steps": [steps[0], steps[1]], "samples": len(used), "rows_seen": len(use.key),
        "rows_seen_more_than_once": int((use.times > 1).sum()),
        "tokens_seen": int(len(use.key) * m.row_tokens), "token_exposures": int(len(used) * m.row_tokens),
        "documents_seen": n_docs, "documents_fully_seen": n_full, "documents_partly_seen": n_docs - n_full,
        "by_shard": per_shard, "by_source": dict(sorted(by_source.items())), "by_file": by_file, "by_lang": _by(docs, "lang"),
    }


@dataclass(frozen=True)
class SeenReport:
    summary: dict
    documents: pa.Table  # one row per document seen (fully or partly)
    consumed: Consumed


def audit_seen(published: Published, used: Consumed, steps: tuple[int, int]) -> SeenReport:
    use = row_use(published.manifest, used)
    spans = seen_spans(published.manifest, read_spans(published), use)
    docs = seen_documents(spans)
    return SeenReport(summarize(published, used, use, docs, steps), docs, used)


def consumed_table(used: Consumed, manifest: Manifest) -> pa.Table:
    """The per-sample answer: global index, step, rank, shard (position and path), row."""
    paths = pa.array([s.path for s in manifest.shards], pa.string())
    return pa.table({
        "index": used.index, "step": used.step, "rank": used.rank, "shard": used.shard.astype(np.int32),
        "shard_path": pc.take(paths, pa.array(used.shard)), "row": used.row,
    })
