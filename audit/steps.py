"""`audit steps`: the documents a window of steps trained on (what was behind a loss spike).

For steps ``A..B`` of a checkpoint: every sample they read (the trained ones, and those skipped
there: a rewind's or a bad step's, flagged), split per rank and micro-batch, joined with the
document index to the documents in its row; per document its source, URL, language, tokens, how
many samples of the run held it before step ``A`` ("seen before": a document repeated across
epochs or duplicated in the data shows up here), and any score columns the index has; and the
losses, gradient norms, spikes and rewinds the run's ``metrics.jsonl`` logged for those steps.

Vectorised like `audit seen`: the join is a sorted search of row keys, the counts are
``bincount``s over an integer code per document, so 100 steps of a million-sample run take
seconds (benchmarks/bench_audit_steps.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.manifests import Published

from .checkpoint import Checkpoint
from .consumed import Consumed, order_at, ranks, skipped_indices, trained_indices
from .seen import DOC_COLUMNS, read_spans, row_offsets

SCORE_COLUMNS = ("lang_score", "quality", "quality_score")  # reported where the document index has them


@dataclass(frozen=True)
class StepsReport:
    summary: dict  # steps, losses, spikes, skips, counts; "documents" as a list (also in the table)
    samples: pa.Table  # one row per (sample, document span in its row)
    documents: pa.Table  # one row per document in the window


def micro_batches(used: Consumed, ckpt: Checkpoint) -> np.ndarray:
    """The micro-batch of each sample inside its rank's local batch (-1 where the rank is unknown)."""
    B = ckpt.global_batch
    micro = np.full(len(used), -1, dtype=np.int64)
    job_micro = int(((ckpt.meta.get("job") or {}).get("data") or {}).get("micro_batch") or 0)
    first = 1
    for last, world_size in ckpt.world_sizes:
        sel = (used.step >= first) & (used.step <= last) & (used.rank >= 0)
        if world_size:
            local = B // world_size
            micro[sel] = ((used.index[sel] % B) % local) // (job_micro or local)
        first = last + 1
    return micro


def run_metrics(ckpt: Checkpoint, steps: tuple[int, int]) -> dict:
    """The run's metrics.jsonl records of these steps: train losses (a step logged again after a
    rewind keeps both, the earlier marked ``rewound``), spikes and rewinds. Empty when the run
    directory holds no metrics.jsonl (a checkpoint copied elsewhere)."""
    path = os.path.join(os.path.dirname(os.path.dirname(ckpt.path)), "metrics.jsonl")
    out = {"metrics_file": path if os.path.isfile(path) else None, "losses": [], "spikes": [], "rewinds": []}
    if out["metrics_file"] is None:
        return out
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for r in records:
        if r.get("rank", 0) != 0 or not isinstance(r.get("step"), int):
            continue  # one rank's view is the run's: the loss and grad norm are global
        if r.get("kind") == "rewind" and r["step"] >= steps[0] and r.get("to_step", 0) < steps[1]:
            out["rewinds"].append(r)
        if not steps[0] <= r["step"] <= steps[1]:
            continue
        if r.get("kind") == "train":
            out["losses"].append({"step": r["step"], "loss": r.get("loss"), "grad_norm": r.get("grad_norm"),
                                  "skipped": bool(r.get("skipped", False)), "rewound": False})
        elif r.get("kind") == "spike":
            out["spikes"].append(r)
    latest = {}
    for i, entry in enumerate(out["losses"]):  # a later record of the same step replaced it after a rewind
        if entry["step"] in latest:
            out["losses"][latest[entry["step"]]]["rewound"] = True
        latest[entry["step"]] = i
    return out


@dataclass(frozen=True)
class Part:
    """The window's samples of one dataset (a plain checkpoint's, or one mixture component's), in that
    dataset's own shards and rows: ``skip_of`` is each sample's position in ``ckpt.skips`` (-1: trained);
    ``prior`` the row keys of the samples of the steps before the window (for ``seen_before``)."""

    name: str | None  # the mixture component; None for a dataset
    published: Published
    window: Consumed
    skip_of: np.ndarray
    micro: np.ndarray
    prior: np.ndarray


def parts(published, ckpt: Checkpoint, steps: tuple[int, int]) -> list[Part]:
    """The window (trained and skipped samples) and the samples before it, per dataset of the data."""
    from gristmill.manifests.mixture import is_mixture

    index, step = trained_indices(ckpt, steps)
    sk_index, sk_step, which = skipped_indices(ckpt, steps)
    index, step = np.concatenate([index, sk_index]), np.concatenate([step, sk_step])
    skip_of = np.concatenate([np.full(len(index) - len(sk_index), -1, np.int64), which])
    rank = ranks(index, step, ckpt)
    rewound = np.zeros(len(index), bool)  # a rewind's samples: no rank trained them
    rewound[len(index) - len(which):] = [ckpt.skips[w]["kind"] == "rewind" for w in which]
    rank[rewound] = -1
    before = trained_indices(ckpt, (ckpt.first_step, steps[0] - 1))[0] if steps[0] > ckpt.first_step else \
        np.zeros(0, np.int64)
    if not is_mixture(published):
        shard, row = order_at(published.manifest, ckpt, index)
        pshard, prow = order_at(published.manifest, ckpt, before)
        window = Consumed(index, step, rank, shard, row)
        return [Part(None, published, window, skip_of, micro_batches(window, ckpt),
                     row_offsets(published.manifest)[pshard] + prow)]
    from .mixture import mixture_order

    order = mixture_order(published, ckpt)
    comp, _, shard, row = order.locate_components(index)
    pcomp, _, pshard, prow = order.locate_components(before)
    out = []
    for c, (spec, pub) in enumerate(zip(published.manifest.components, published.components)):
        sel, psel = comp == c, pcomp == c
        window = Consumed(index[sel], step[sel], rank[sel], shard[sel], row[sel])
        out.append(Part(spec.name, pub, window, skip_of[sel], micro_batches(window, ckpt),
                        row_offsets(pub.manifest)[pshard[psel]] + prow[psel]))
    return out


def audit_steps(published, ckpt: Checkpoint, steps: tuple[int, int]) -> StepsReport:
    """The window's documents and samples (a mixture's per component, ids ``<component>/<doc_id>``)."""
    skip_reason = np.array([f"{s['kind']} at step {s['step']}: {s['reason']}" for s in ckpt.skips] + [None], dtype=object)
    ps = parts(published, ckpt, steps)
    tables = [_part_tables(p, skip_reason) for p in ps]
    samples = pa.concat_tables([t[0] for t in tables], promote_options="permissive") \
        .sort_by([("step", "ascending"), ("index", "ascending"), ("tokens", "descending")])
    documents = pa.concat_tables([t[1] for t in tables], promote_options="permissive") \
        .sort_by([("first_step", "ascending"), ("_first_index", "ascending")]).drop_columns(["_first_index"])
    m = published.manifest
    metrics = run_metrics(ckpt, steps)
    skips = [s for s in ckpt.skips if s["step"] >= steps[0] and (s.get("after_step") or s["step"] - 1) < steps[1]]
    summary = {
        "checkpoint": ckpt.path, "steps": [steps[0], steps[1]], "dataset": getattr(m, "dataset", None) or m.name,
        "components": [p.name for p in ps] if ps[0].name else None,
        "version": m.version, "manifest_sha256": m.sha256, "manifest_url": published.url,
        "global_batch": ckpt.global_batch,
        "samples_trained": sum(int((p.skip_of < 0).sum()) for p in ps),
        "samples_skipped": sum(int((p.skip_of >= 0).sum()) for p in ps),
        "documents": documents.num_rows, "skips": skips, **metrics,
    }
    return StepsReport(summary, samples, documents)


def _part_tables(part: Part, skip_reason: np.ndarray) -> tuple[pa.Table, pa.Table]:
    """(samples, documents, part) of one dataset's share of the window."""
    pub, window, skip_of, micro = part.published, part.window, part.skip_of, part.micro
    m = pub.manifest
    offsets = row_offsets(m)
    columns = DOC_COLUMNS + [c for c in SCORE_COLUMNS if c in _index_columns(pub)]
    spans = read_spans(pub, columns=columns)
    if part.name is not None:  # a mixture's documents are (component, id), as everywhere in the audit
        spans = spans.set_column(spans.schema.get_field_index("doc_id"), "doc_id",
                                 pc.binary_join_element_wise(part.name, spans.column("doc_id"), "/"))
    span_keys = offsets[spans.column("shard").to_numpy()] + spans.column("row").to_numpy()
    by_key = np.argsort(span_keys, kind="stable")
    sorted_keys = span_keys[by_key]
    codes = pc.dictionary_encode(spans.column("doc_id")).combine_chunks().indices.to_numpy().astype(np.int64)
    length = spans.column("length").to_numpy().astype(np.int64)
    n_docs = int(codes.max()) + 1 if len(codes) else 0

    # (sample, span) pairs: every span of the row each window sample read.
    wkeys = offsets[window.shard] + window.row
    lo, hi = np.searchsorted(sorted_keys, wkeys, "left"), np.searchsorted(sorted_keys, wkeys, "right")
    counts = hi - lo
    sample_of = np.repeat(np.arange(len(window)), counts)
    span_of = by_key[np.repeat(lo, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))]

    # Seen before: samples of the run's earlier steps (on this manifest) holding a span of the document.
    prior = np.sort(part.prior)
    in_window = np.zeros(n_docs, dtype=bool)
    in_window[codes[span_of]] = True
    wanted = np.flatnonzero(in_window[codes])  # only the spans of the window's documents are counted
    prior_hits = np.searchsorted(prior, span_keys[wanted], "right") - np.searchsorted(prior, span_keys[wanted], "left")
    seen_before = np.bincount(codes[wanted], weights=prior_hits, minlength=n_docs).astype(np.int64)
    total_tokens = np.bincount(codes[wanted], weights=length[wanted], minlength=n_docs).astype(np.int64)

    paths = pa.array([(f"{part.name}/" if part.name else "") + s.path for s in m.shards], pa.string())
    trained = skip_of[sample_of] < 0
    samples = pa.table({
        "step": window.step[sample_of], "rank": window.rank[sample_of], "micro_batch": micro[sample_of],
        "index": window.index[sample_of], "shard_path": pc.take(paths, pa.array(window.shard[sample_of])),
        "row": window.row[sample_of], "doc_id": spans.column("doc_id").take(span_of),
        "tokens": length[span_of], "trained": trained,
        "skipped": pa.array(skip_reason[skip_of[sample_of]], pa.string()),
    })
    documents = _documents(spans, span_of, codes, sample_of, window, micro, trained, skip_reason[skip_of[sample_of]],
                           seen_before, total_tokens, columns)
    return samples, documents


def _index_columns(published: Published) -> list[str]:
    import pyarrow.parquet as pq

    from gristmill.manifests.store import join

    from gristmill.manifests.storage import Store

    url = join(published.url, published.manifest.doc_index.path)
    try:
        with (published.store or Store.from_url(url)).open(url) as f:
            return pq.read_schema(f).names
    except (OSError, ValueError):  # read_spans reads (and hash-checks) it next, and says what is wrong
        return []


def _documents(spans, span_of, codes, sample_of, window, micro, trained, skipped_why, seen_before, total_tokens,
               columns) -> pa.Table:
    """One row per document in the window, ordered by its first step there, then its first sample."""
    doc_code = codes[span_of]
    table = pa.table({
        "code": doc_code, "step": window.step[sample_of], "index": window.index[sample_of],
        "rank": window.rank[sample_of], "micro_batch": micro[sample_of],
        "tokens": spans.column("length").to_numpy().astype(np.int64)[span_of],
        "trained": trained, "skipped": pa.array(skipped_why, pa.string()),
        "first_span": span_of,
    })
    g = table.group_by("code", use_threads=False).aggregate([
        ("step", "min"), ("step", "max"), ("index", "min"), ("trained", "sum"), ("trained", "count"),
        ("tokens", "sum"), ("rank", "distinct"), ("micro_batch", "distinct"),
        ("skipped", "distinct", pc.CountOptions(mode="only_valid")), ("first_span", "min")])
    code = g.column("code").to_numpy()
    first = g.column("first_span_min").to_numpy()
    out = {"doc_id": spans.column("doc_id").take(first)}
    for name in [c for c in columns if c not in ("shard", "row", "start", "length", "doc_id")]:
        out[name] = spans.column(name).take(first)
    trained_samples = g.column("trained_sum").to_numpy().astype(np.int64)
    out.update({
        "tokens": total_tokens[code], "first_step": g.column("step_min"), "last_step": g.column("step_max"),
        "samples_trained": trained_samples,
        "samples_skipped": g.column("trained_count").to_numpy().astype(np.int64) - trained_samples,
        "tokens_in_steps": g.column("tokens_sum"), "seen_before": seen_before[code],
        "ranks": g.column("rank_distinct"), "micro_batches": g.column("micro_batch_distinct"),  # in training order
        "skipped": g.column("skipped_distinct"),  # why its skipped samples were (empty: all trained)
        "_first_index": g.column("index_min"),
    })
    return pa.table(out)  # sorted, and _first_index dropped, once the parts are together
