"""The fuzzy-dedup stage: near-duplicate documents (MinHash + LSH), clustered, all but one removed.

Every step is a Ray Data map or hash shuffle, so no worker holds all signatures, all candidate
pairs or the whole graph (see docs/fuzzy-dedup.md):

1. signatures: ``MinHasher`` over batches of text; each document becomes ``bands`` rows
   ``(band, key, order)``, ``key`` the 64-bit hash of that band of its signature;
2. buckets: hash shuffle on ``(band, key)``; each bucket links every member to its earliest member
   (``order`` smallest), so a bucket of k documents gives k - 1 edges, not k^2 / 2;
3. similarity: each candidate edge joined with both documents; exact Jaccard of their shingles
   (``verify: true``, the default, dropping pairs below the threshold) or the signature estimate;
4. clusters: distributed connected components (``pipeline.components``) over the edges;
5. in every cluster the earliest document (smallest ``order``) survives; the others are removed
   with ``duplicate_of`` = ``cluster`` = the survivor's id and the best similarity of an edge
   that linked them.
"""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from gristmill.pipeline.components import connected_components
# The stage's config is a section of the one prepare-job model; importable from here as before.
from gristmill.pipeline.config import FuzzyDedupConfig
from gristmill.pipeline.lsh import LSHParams, band_keys
from gristmill.pipeline.minhash import MinHasher, jaccard
from gristmill.pipeline.stage import StageResult

REASON = "near_duplicate"


@functools.lru_cache(maxsize=4)
def _hasher(num_perm: int, ngram: int, seed: int) -> MinHasher:
    """One MinHasher per worker process (its tables are reused across batches)."""
    return MinHasher(num_perm=num_perm, ngram=ngram, seed=seed)


def _band_rows(batch: dict, cfg: FuzzyDedupConfig, bands: int, rows: int) -> dict:
    """Signature batch -> one (band, key, order) row per band of every document with shingles."""
    mh = _hasher(cfg.num_perm, cfg.ngram, cfg.seed)
    sh = mh.shingles(list(batch["text"]))
    has = sh.counts() > 0  # a document without words resembles nothing (its signature is all-max)
    keys = band_keys(mh.signatures_of(sh)[has], bands, rows)
    order = np.asarray(batch["order"], dtype=np.int64)[has]
    return {
        "band": np.tile(np.arange(bands, dtype=np.int64), len(order)),
        "key": keys.reshape(-1),
        "order": np.repeat(order, bands),
    }


def _bucket_edges(batch: dict) -> dict:
    """One partition of buckets: link every member of a (band, key) bucket to its earliest member."""
    band, key, order = batch["band"], batch["key"], batch["order"]
    idx = np.lexsort((order, key, band))
    band, key, order = band[idx], key[idx], order[idx]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (band[1:] != band[:-1]) | (key[1:] != key[:-1])
    first = np.maximum.accumulate(np.where(new, np.arange(len(order)), 0))
    member = ~new
    return {"hi": order[member], "lo": order[first][member]}


def _similarity(batch: dict, cfg: FuzzyDedupConfig) -> dict:
    """Exact Jaccard of each candidate pair's shingle sets (both texts are in the batch)."""
    mh = _hasher(cfg.num_perm, cfg.ngram, cfg.seed)
    a, b = mh.shingles(list(batch["text_hi"])), mh.shingles(list(batch["text_lo"]))
    sim = np.array([jaccard(a.of(i), b.of(i)) for i in range(len(batch["hi"]))], dtype=np.float64)
    return {"hi": batch["hi"], "lo": batch["lo"], "similarity": sim}


def _estimated_similarity(batch: dict, cfg: FuzzyDedupConfig) -> dict:
    """MinHash estimate of each candidate pair's Jaccard (fraction of equal signature values)."""
    mh = _hasher(cfg.num_perm, cfg.ngram, cfg.seed)
    a, b = mh.signatures(list(batch["text_hi"])), mh.signatures(list(batch["text_lo"]))
    return {"hi": batch["hi"], "lo": batch["lo"], "similarity": np.mean(a == b, axis=1)}


def _at_least(batch: dict, threshold: float) -> dict:
    keep = batch["similarity"] >= threshold
    return {k: v[keep] for k, v in batch.items()}


def _best_link(batch: dict) -> dict:
    """One partition of (node, other, similarity): each node's most similar linked document."""
    node, other, sim = batch["node"], batch["other"], batch["similarity"]
    idx = np.lexsort((other, -sim, node))  # best similarity first, ties to the earliest document
    first = np.ones(len(node), dtype=bool)
    first[1:] = node[idx][1:] != node[idx][:-1]
    pick = idx[first]
    return {"node": node[pick], "linked": other[pick], "similarity": sim[pick]}


def _both_ends(batch: dict) -> dict:
    return {
        "node": np.concatenate([batch["hi"], batch["lo"]]),
        "other": np.concatenate([batch["lo"], batch["hi"]]),
        "similarity": np.concatenate([batch["similarity"], batch["similarity"]]),
    }


def _distinct_pairs(batch: dict) -> dict:
    """Drop repeated (hi, lo) rows: a pair sharing several bands is one candidate. The join output
    is keyed by ``hi``, so copies of a pair share a block unless Ray split a huge partition; a
    copy that slips through only costs one more similarity (later steps ignore duplicates)."""
    idx = np.lexsort((batch["lo"], batch["hi"]))
    hi, lo = batch["hi"][idx], batch["lo"][idx]
    keep = np.ones(len(hi), dtype=bool)
    keep[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
    return {k: v[idx][keep] for k, v in batch.items()}


def _join_texts(edges, texts, num_partitions: int):
    """Attach both documents' texts to each distinct (hi, lo) candidate edge."""
    on_hi = edges.join(texts.rename_columns({"order": "hi", "text": "text_hi"}), "inner", num_partitions, on=("hi",))
    on_hi = on_hi.map_batches(_distinct_pairs, batch_size=None, batch_format="numpy")
    return on_hi.join(texts.rename_columns({"order": "lo", "text": "text_lo"}), "inner", num_partitions, on=("lo",))


def find_near_duplicates(docs, cfg: FuzzyDedupConfig, work_dir: str) -> StageResult:
    """Remove near-duplicates from ``docs`` (a ray.data.Dataset with ``id``, ``order``, ``text``).

    Joins and repartitions hash-partition by key into ``cfg.num_partitions`` blocks, one per
    partition (the guarantee Ray's own ``map_groups`` relies on), so the per-partition numpy
    steps see every row of a key together.
    """
    missing = {"id", "order", "text"} - set(docs.schema().names)
    if missing:
        raise ValueError(f"fuzzy_dedup: input documents lack column(s) {sorted(missing)}")
    params = cfg.lsh()
    p = cfg.num_partitions
    texts = docs.select_columns(["order", "text"])

    bands = texts.map_batches(_band_rows, fn_args=(cfg, params.bands, params.rows),
                              batch_size=cfg.batch_size, batch_format="numpy")
    candidates = bands.repartition(p, keys=["band", "key"]).map_batches(
        _bucket_edges, batch_size=None, batch_format="numpy")
    score = _similarity if cfg.verify else _estimated_similarity
    scored = _join_texts(candidates, texts, p).map_batches(score, fn_args=(cfg,), batch_format="numpy")
    scored = scored.materialize()
    n_candidates = scored.count()
    if cfg.verify:  # exact Jaccard below the threshold: an LSH false positive
        scored = scored.map_batches(_at_least, fn_args=(cfg.threshold,), batch_format="numpy").materialize()
    n_linked = scored.count()
    if n_linked == 0:  # nothing to cluster: every document survives
        stats = _stats(docs.count(), None, params, cfg, n_candidates, 0)
        return StageResult(kept=docs, removed=docs.limit(0), stats=stats)

    clusters = connected_components(scored.select_columns(["hi", "lo"]), p)
    # Per document, the most similar edge that linked it (repartitioned so a node's edges meet).
    best = (scored.map_batches(_both_ends, batch_format="numpy").repartition(p, keys=["node"])
            .map_batches(_best_link, batch_size=None, batch_format="numpy"))
    linked = clusters.join(best, "inner", p, on=("node",))
    survivor_ids = docs.select_columns(["order", "id"]).rename_columns({"order": "root", "id": "duplicate_of"})
    removed_info = linked.join(survivor_ids, "inner", p, on=("root",)).materialize()

    detail = removed_info.select_columns(["node", "duplicate_of", "similarity"]).rename_columns({"node": "order"})
    removed = docs.join(detail, "inner", p, on=("order",)).map_batches(_add_reason, batch_format="pyarrow")
    kept = docs.join(detail.select_columns(["order"]), "left_anti", p, on=("order",))

    stats = _stats(docs.count(), removed_info, params, cfg, n_candidates, n_linked)
    return StageResult(kept=kept, removed=removed, stats=stats)


def _add_reason(table: pa.Table) -> pa.Table:
    n = table.num_rows
    table = table.append_column("reason", pa.array([REASON] * n, pa.string()))
    return table.append_column("cluster", table.column("duplicate_of"))


def _size_histogram(batch: dict) -> dict:
    """Histogram rows (size, clusters) of a batch of per-survivor removed counts."""
    sizes, counts = np.unique(batch["count()"] + 1, return_counts=True)
    return {"size": sizes.astype(np.int64), "clusters": counts.astype(np.int64)}


def _earliest(batch: dict, k: int) -> dict:
    """The k earliest removed documents of a batch (the driver merges these few rows)."""
    idx = np.argsort(batch["node"], kind="stable")[:k]
    return {c: batch[c][idx] for c in ("node", "duplicate_of", "linked", "similarity")}


def _stats(n_docs: int, removed_info, params: LSHParams, cfg: FuzzyDedupConfig, n_candidates: int,
           n_linked: int) -> dict:
    histogram: dict[int, int] = {}
    sample = []
    if removed_info is not None:
        per_survivor = removed_info.groupby("root").count()  # one row per cluster, on the workers
        for row in per_survivor.map_batches(_size_histogram, batch_format="numpy").take_all():
            histogram[int(row["size"])] = histogram.get(int(row["size"]), 0) + int(row["clusters"])
        if cfg.sample_pairs:
            rows = removed_info.map_batches(_earliest, fn_args=(cfg.sample_pairs,), batch_format="numpy").take_all()
            sample = sorted(rows, key=lambda r: int(r["node"]))[: cfg.sample_pairs]
    return {
        "documents_in": n_docs,
        "documents_removed": sum((size - 1) * n for size, n in histogram.items()),
        "lsh": params.to_dict(),
        "config": cfg.to_dict(),
        "candidate_pairs": n_candidates,
        "pairs_linked": n_linked,
        "clusters": sum(histogram.values()),
        "cluster_sizes": {str(size): histogram[size] for size in sorted(histogram)},
        "sample_pairs": [  # by input order: the removed document, its survivor, the one that linked it
            {"removed_order": int(r["node"]), "survivor": str(r["duplicate_of"]), "linked_order": int(r["linked"]),
             "similarity": round(float(r["similarity"]), 4)}
            for r in sample
        ],
    }
