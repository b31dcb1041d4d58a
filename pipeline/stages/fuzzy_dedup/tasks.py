"""Fuzzy dedup's tasks: near-duplicate documents (MinHash + LSH), clustered, all but one removed.

Every step is tasks over files in the work dir (run in order by ``pipeline.stages.fuzzy_dedup``,
through ``pipeline.runner``); the document text is
read where it lies and never moves (see docs/fuzzy-dedup.md):

1. ``bands`` (a task per partition): MinHash signatures of the partition's surviving documents;
   each document becomes ``bands`` rows ``(bucket, band, key, order)``, ``key`` the 64-bit hash
   of that band of its signature, ``bucket`` its top 16 bits; written sorted by bucket;
2. ``candidates`` (a task per bucket range): every (band, key) bucket pairs each member with its
   few earliest members and its predecessor (``lsh.bucket_pairs``), so a bucket of k documents
   gives at most 5k pairs, not k^2 / 2; it also lists each partition's documents in some pair;
3. ``members`` (a task per partition): the shingle sets (or signatures) of just those documents;
4. ``verify`` (a task per partition of the edges' later end): exact Jaccard of each distinct
   candidate pair (``verify: true``, the default, dropping pairs below the threshold) or the
   signature estimate;
5. ``components``: connected components over the verified edges (``pipeline.connected_components``);
6. ``assign`` (a task per components bucket): each non-root node of the bucket with its root
   (the earliest document of its cluster) and its best link, sorted by the node's partition;
   the sizes of the clusters rooted there;
7. ``removed`` (a task per partition): in every cluster the earliest document (smallest
   ``order``) survives; the others are removed with ``duplicate_of`` = ``cluster`` = the
   survivor's id and the best similarity of an edge that linked them.

Task lists come from the data (partitions, bucket ranges), so the result is the same for any
worker count, and each task's marker lets a rerun skip it.
"""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ... import connected_components as cc
from ...documents import REMOVED_SCHEMA, to_removed_rows
from ...lsh import LSHParams, band_keys, bucket_pairs, pair_jaccard
from ...lsh import BAND_ROWS_PER_TASK, BUCKETS, plan_bucket_ranges  # noqa: F401
from ...minhash import MinHasher
from ...survivors import Survivors
from ...workdir import WorkDir
from .config import FuzzyDedupConfig

STAGE = "fuzzy_dedup"
REASON = "near_duplicate"
_ROW_GROUP = 65_536

BAND_SCHEMA = pa.schema([("bucket", pa.int32()), ("band", pa.int32()), ("key", pa.uint64()), ("order", pa.int64())])
CANDIDATE_SCHEMA = pa.schema([("hi_part", pa.int32()), ("hi", pa.int64()), ("lo", pa.int64())])
ENDPOINT_SCHEMA = pa.schema([("part", pa.int32()), ("order", pa.int64())])
MEMBER_SCHEMA = pa.schema([("order", pa.int64()), ("id", pa.string()), ("bytes", pa.int64()),
                           ("shingles", pa.list_(pa.uint64())), ("signature", pa.list_(pa.uint32()))])
LINK_SCHEMA = pa.schema([("bucket", pa.int32()), ("node", pa.int64()), ("other", pa.int64()), ("similarity", pa.float64())])
ASSIGN_SCHEMA = pa.schema([("part", pa.int32()), ("node", pa.int64()), ("root", pa.int64()), ("linked", pa.int64()),
                           ("similarity", pa.float64())])


@functools.lru_cache(maxsize=4)
def _hasher(num_perm: int, ngram: int, seed: int) -> MinHasher:
    """One MinHasher per worker process (its tables are reused across batches)."""
    return MinHasher(num_perm=num_perm, ngram=ngram, seed=seed)



# -- 1. bands ------------------------------------------------------------------------------------
def bands_task(item: dict, cfg: FuzzyDedupConfig, params: LSHParams, survivors: Survivors) -> dict:
    mh = _hasher(cfg.num_perm, cfg.ngram, cfg.seed)
    out = survivors.wd.part(survivors.wd.part_scratch(STAGE, "bands", item["part"]), BAND_SCHEMA, row_group_size=_ROW_GROUP)
    tables, docs, nbytes = [], 0, 0
    for t in survivors.docs(item["part"], ["id", "order", "text", "bytes"], cfg.batch_size):
        docs += t.num_rows
        nbytes += int(pc.sum(t.column("bytes")).as_py() or 0)
        sh = mh.shingles(t.column("text").to_pylist())
        has = sh.counts() > 0  # a document without words resembles nothing (its signature is all-max)
        keys = band_keys(mh.signatures_of(sh)[has], params.bands, params.rows).reshape(-1)
        order = t.column("order").to_numpy()[has]
        tables.append(pa.table({
            "bucket": (keys >> np.uint64(48)).astype(np.int32),
            "band": np.tile(np.arange(params.bands, dtype=np.int32), len(order)),
            "key": keys, "order": np.repeat(order, params.bands)}, schema=BAND_SCHEMA))
    t = pa.concat_tables(tables) if tables else BAND_SCHEMA.empty_table()
    out.write(t.sort_by([("bucket", "ascending"), ("band", "ascending"), ("key", "ascending"), ("order", "ascending")]))
    out.commit()
    return {"documents_in": docs, "bytes_in": nbytes, "band_rows": t.num_rows}


# -- 2. candidates -------------------------------------------------------------------------------


def candidates_task(item: dict, wd: WorkDir, bands: list[str]) -> dict:
    """One bucket range over every partition's band rows (``bands``: the block files, ``WorkDir.whole_files``)."""
    flt = [("bucket", ">=", item["lo"]), ("bucket", "<", item["hi"])]
    t = pa.concat_tables([wd.read_parquet(b, ["band", "key", "order"], flt) for b in bands])
    hi, lo = bucket_pairs(t.column("band").to_numpy(), t.column("key").to_numpy(), t.column("order").to_numpy())
    idx = np.lexsort((lo, hi))
    hi, lo = hi[idx], lo[idx]
    out = wd.part(wd.scratch(STAGE, "candidates", item["name"]), CANDIDATE_SCHEMA, row_group_size=_ROW_GROUP)
    out.write(pa.table({"hi_part": (hi >> 32).astype(np.int32), "hi": hi, "lo": lo}, schema=CANDIDATE_SCHEMA))
    out.commit()
    ends = np.unique(np.concatenate([hi, lo]))
    ep = wd.part(wd.scratch(STAGE, "endpoints", item["name"]), ENDPOINT_SCHEMA, row_group_size=_ROW_GROUP)
    ep.write(pa.table({"part": (ends >> 32).astype(np.int32), "order": ends}, schema=ENDPOINT_SCHEMA))
    ep.commit()
    return {"band_rows": t.num_rows, "pairs": len(hi)}


# -- 3. members ----------------------------------------------------------------------------------
def members_task(item: dict, cfg: FuzzyDedupConfig, survivors: Survivors, candidates: list[str]) -> dict:
    """The partition's documents that are in some candidate pair (``candidates``: the candidates
    tasks' names, whose endpoint files list them)."""
    part, wd = item["part"], survivors.wd
    wanted = np.unique(np.concatenate([wd.read_parquet(wd.scratch(STAGE, "endpoints", c), ["order"], [("part", "=", part)])
                                       .column("order").to_numpy() for c in candidates])) if candidates \
        else np.zeros(0, np.int64)
    mh = _hasher(cfg.num_perm, cfg.ngram, cfg.seed)
    out = wd.part(wd.part_scratch(STAGE, "members", part), MEMBER_SCHEMA)
    n = 0
    if len(wanted):
        for t in survivors.docs(part, ["id", "order", "text", "bytes"], cfg.batch_size):
            t = t.filter(pc.is_in(t.column("order"), pa.array(wanted)))
            if not t.num_rows:
                continue
            sh = mh.shingles(t.column("text").to_pylist())
            if cfg.verify:
                sets = [np.unique(sh.of(i)) for i in range(t.num_rows)]
                sigs = [None] * t.num_rows
            else:
                sets = [None] * t.num_rows
                sigs = list(mh.signatures_of(sh))
            out.write(pa.table({"order": t.column("order"), "id": t.column("id"), "bytes": t.column("bytes"),
                                "shingles": pa.array(sets, pa.list_(pa.uint64())),
                                "signature": pa.array(sigs, pa.list_(pa.uint32()))}, schema=MEMBER_SCHEMA))
            n += t.num_rows
    out.commit()
    return {"members": n}


def _members(wd: WorkDir, parts: set[int], orders: np.ndarray, columns: list[str]) -> dict[int, dict]:
    """order -> member row, for the given orders, read from their partitions' member files only."""
    rows: dict[int, dict] = {}
    want = pa.array(orders, pa.int64())
    for p in sorted(parts):
        t = wd.read_parquet(wd.part_scratch(STAGE, "members", p), ["order", *columns])
        t = t.filter(pc.is_in(t.column("order"), want))
        for r in t.to_pylist():
            rows[r["order"]] = r
    return rows


def _member_table(wd: WorkDir, parts: set[int], orders: np.ndarray, columns: list[str]) -> pa.Table:
    """The member rows of the given orders (read from their partitions' member files only), by order."""
    want = pa.array(orders, pa.int64())
    tables = [wd.read_parquet(wd.part_scratch(STAGE, "members", p), ["order", *columns]) for p in sorted(parts)]
    tables = [t.filter(pc.is_in(t.column("order"), want)) for t in tables]
    return pa.concat_tables(tables).sort_by("order") if tables else MEMBER_SCHEMA.empty_table().select(["order", *columns])


def _csr(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A list column as (values, offsets): row i is ``values[offsets[i]:offsets[i + 1]]``."""
    col = column.combine_chunks()
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    return pc.list_flatten(col).to_numpy(), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


# -- 4. verify -----------------------------------------------------------------------------------
def verify_task(item: dict, cfg: FuzzyDedupConfig, wd: WorkDir, candidates: list[str]) -> dict:
    part = item["part"]
    t = pa.concat_tables([wd.read_parquet(wd.scratch(STAGE, "candidates", c), ["hi", "lo"], [("hi_part", "=", part)])
                          for c in candidates])
    pairs = np.unique(np.stack([t.column("hi").to_numpy(), t.column("lo").to_numpy()], axis=1), axis=0) \
        if t.num_rows else np.zeros((0, 2), np.int64)  # a pair sharing several bands is one candidate
    hi, lo = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    col = "shingles" if cfg.verify else "signature"
    ends = np.unique(np.concatenate([hi, lo]))
    m = _member_table(wd, {int(p) for p in (ends >> 32)}, ends, [col])
    values, offsets = _csr(m.column(col))
    orders = m.column("order").to_numpy()
    a, b = np.searchsorted(orders, hi), np.searchsorted(orders, lo)  # every end is a member
    if cfg.verify:  # exact Jaccard of the shingle sets (sorted, distinct), all pairs in one loop
        sim = pair_jaccard(values, offsets, a, b)
        keep = sim >= cfg.threshold  # exact Jaccard below the threshold: an LSH false positive
    else:  # the signature estimate: the fraction of equal MinHash values
        sig = values.reshape(len(orders), cfg.num_perm) if len(orders) else np.zeros((0, cfg.num_perm), values.dtype)
        sim = (sig[a] == sig[b]).mean(axis=1) if len(a) else np.zeros(0, np.float64)
        keep = np.ones(len(hi), dtype=bool)
    hi, lo, sim = hi[keep], lo[keep], sim[keep]
    cc.write_edges(wd.part_scratch(STAGE, "edges", part), np.concatenate([hi, lo]), np.concatenate([lo, hi]), item["buckets"],
                   wd.store)
    node, other, s2 = np.concatenate([hi, lo]), np.concatenate([lo, hi]), np.concatenate([sim, sim])
    bucket = cc.bucket_of(node, item["buckets"])  # the node's components bucket: its assign task reads it
    idx = np.lexsort((other, node, bucket))
    links = wd.part(wd.part_scratch(STAGE, "links", part), LINK_SCHEMA, row_group_size=_ROW_GROUP)
    links.write(pa.table({"bucket": bucket[idx], "node": node[idx], "other": other[idx], "similarity": s2[idx]},
                         schema=LINK_SCHEMA))
    links.commit()
    return {"candidate_pairs": len(pairs), "pairs_linked": int(keep.sum())}


# -- 6. assign -----------------------------------------------------------------------------------
def assign_task(item: dict, wd: WorkDir, star_files: list[str], links: list[str]) -> dict:
    """One components bucket: each of its non-root nodes with its root and its best link (its
    most similar verified edge, ties to the earliest other document), written sorted by the
    node's partition; and the sizes of the clusters whose root is in the bucket."""
    b = item["bucket"]
    star = cc.read_bucket(star_files, b, wd.store)
    pairs = np.unique(np.stack([star["u"], star["v"]], axis=1), axis=0) if len(star["u"]) else np.zeros((0, 2), np.int64)
    u, v = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    leaf = v < u  # at the fixed point a leaf's one row points at its root; a root's rows list its members
    node, rootv = u[leaf], v[leaf]
    lk = pa.concat_tables([wd.read_parquet(n, ["node", "other", "similarity"], [("bucket", "=", b)])
                           for n in links])
    best: dict[int, tuple[float, int]] = {}
    for n_, o_, s_ in zip(*(lk.column(c).to_pylist() for c in ("node", "other", "similarity"))):
        if n_ not in best or (s_, -o_) > (best[n_][0], -best[n_][1]):
            best[n_] = (s_, o_)
    idx = np.lexsort((node, node >> 32))
    node, rootv = node[idx], rootv[idx]
    out = wd.part(wd.scratch(STAGE, "assign", item["name"]), ASSIGN_SCHEMA, row_group_size=_ROW_GROUP)
    out.write(pa.table({"part": (node >> 32).astype(np.int32), "node": node, "root": rootv,
                        "linked": [best[n][1] for n in node.tolist()], "similarity": [best[n][0] for n in node.tolist()]},
                       schema=ASSIGN_SCHEMA))
    out.commit()
    _, members = np.unique(u[~leaf], return_counts=True)
    sizes, clusters = np.unique(members + 1, return_counts=True)
    return {"cluster_sizes": {str(int(k)): int(n) for k, n in zip(sizes, clusters)}}


# -- 7. removed ----------------------------------------------------------------------------------
def removed_task(item: dict, cfg: FuzzyDedupConfig, wd: WorkDir, assigned: list[str]) -> dict:
    """This partition's removed documents, from its rows of every assign file (``assigned``: the assign tasks' names)."""
    part = item["part"]
    t = pa.concat_tables([wd.read_parquet(wd.scratch(STAGE, "assign", n), ["node", "root", "linked", "similarity"],
                                [("part", "=", part)]) for n in assigned]) if assigned else ASSIGN_SCHEMA.empty_table()
    t = t.sort_by("node")
    node, rootv = t.column("node").to_numpy(), t.column("root").to_numpy()
    mine = _members(wd, {part}, node, ["id", "bytes"]) if len(node) else {}
    survivors = _members(wd, {int(p) for p in (rootv >> 32)}, np.unique(rootv), ["id"]) if len(rootv) else {}
    sid = [survivors[r]["id"] for r in rootv.tolist()]
    rows = pa.table({"id": [mine[n]["id"] for n in node.tolist()], "order": node, "part": pa.array([part] * len(node), pa.int32()),
                     "bytes": [mine[n]["bytes"] for n in node.tolist()], "reason": [REASON] * len(node),
                     "duplicate_of": sid, "duplicate_of_order": rootv, "cluster": sid, "similarity": t.column("similarity")})
    out = wd.part(wd.removed(STAGE, part), REMOVED_SCHEMA)
    out.write(to_removed_rows(rows, STAGE) if rows.num_rows else REMOVED_SCHEMA.empty_table())
    out.commit()
    # the report's sample: documents by id (an ``order`` depends on the partitioning; the
    # published statistics must not)
    k = min(cfg.sample_pairs, len(node))
    linked = t.column("linked").to_numpy()[:k]
    linked_ids = _members(wd, {int(p) for p in (linked >> 32)}, np.unique(linked), ["id"]) if k else {}
    sample = [{"removed": mine[o]["id"], "survivor": d, "linked": linked_ids[lo_]["id"], "similarity": round(float(s), 4)}
              for o, d, lo_, s in zip(node[:k].tolist(), sid[:k], linked.tolist(), t.column("similarity").to_pylist()[:k])]
    return {"removed": {REASON: rows.num_rows} if rows.num_rows else {},
            "removed_bytes": int(sum(b or 0 for b in rows.column("bytes").to_pylist())) if rows.num_rows else 0,
            "sample": sample}
