"""Connected components of a large edge list as Ray tasks over edge files, memory bounded per task.

Alternating Large-Star / Small-Star (Kiveris et al., "Connected Components in MapReduce and
Beyond", SoCC 2014). Each step is a shuffle of the edges keyed by a node, done through files:
every task writes its output rows tagged with the hash bucket of their key node and sorted by
it, and the next step's task for bucket range [lo, hi) reads only those rows of every file
(row-group pruning). A task holds its buckets' edges, never the whole graph (unlike a
single-process union-find). The steps:

- large-star: every node u links each *larger* neighbour v to m(u), u's smallest neighbour or u;
- small-star: every node u links each *smaller* neighbour v, and itself, to m, the smallest of them.

Both preserve connectivity; repeated until the edge set stops changing, the graph becomes one
star per component centred on the component's smallest node, in O(log^2 n) rounds (a few in
practice). Node ids are int64 (the documents' ``order``), so "smallest" is "earliest in input
order" and the result is the same whatever the partitioning.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pyarrow as pa

from gristmill.manifests.runs import run_starts
from gristmill.manifests.storage import Store

from .workdir import read_parquet, writer

_MAX_ROUNDS = 100


def _sorted_unique_edges(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (u, v) pairs sorted by u then v."""
    if len(u) == 0:
        return u, v
    order = np.lexsort((v, u))
    u, v = u[order], v[order]
    keep = run_starts(u, v)
    return u[keep], v[keep]


def _canonical(a: np.ndarray, b: np.ndarray) -> dict:
    """Edges as (hi, lo) with hi > lo, self-loops dropped."""
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    keep = hi != lo
    return {"hi": hi[keep].astype(np.int64), "lo": lo[keep].astype(np.int64)}


def large_star(batch: dict) -> dict:
    """One partition of large-star; ``batch`` holds every directed edge (u, v) of its nodes u."""
    u, v = _sorted_unique_edges(batch["u"], batch["v"])
    if len(u) == 0:
        return _canonical(u, v)
    starts = np.flatnonzero(run_starts(u))
    m = np.minimum(np.minimum.reduceat(v, starts), u[starts])  # smallest neighbour or self
    m_row = np.repeat(m, np.diff(np.append(starts, len(u))))
    larger = v > u
    return _canonical(v[larger], m_row[larger])


def small_star(batch: dict) -> dict:
    """One partition of small-star; ``batch`` holds (u, v) for every edge whose larger end is u."""
    u, v = _sorted_unique_edges(batch["u"], batch["v"])
    if len(u) == 0:
        return _canonical(u, v)
    starts = np.flatnonzero(run_starts(u))
    m = np.minimum.reduceat(v, starts)  # v < u always here, so the smallest of N(u) and u
    m_row = np.repeat(m, np.diff(np.append(starts, len(u))))
    return _canonical(np.concatenate([v, u[starts]]), np.concatenate([m_row, m]))


def _checksum(batch: dict) -> dict:
    """Order-independent fingerprint of a partition's edges: count and a hash sum."""
    h = batch["hi"].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ batch["lo"].astype(np.uint64)
    h ^= h >> np.uint64(31)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    total = int(h.sum(dtype=np.uint64)) if len(h) else 0
    return {"n": np.array([len(h)], dtype=np.int64), "h": np.array([str(total)])}



# -- Ray tasks over edge files ------------------------------------------------------------------
EDGES_PER_TASK = 4_000_000  # ~100 MB of int64 edges (both directions) per task
EDGE_SCHEMA = pa.schema([("bucket", pa.int32()), ("u", pa.int64()), ("v", pa.int64())])
_ROW_GROUP = 65_536


def bucket_count(edges: int) -> int:
    """Buckets (= tasks per step) for an edge count: data-defined, never the worker count."""
    return max(1, math.ceil(edges / EDGES_PER_TASK))


def bucket_of(nodes: np.ndarray, buckets: int) -> np.ndarray:
    h = nodes.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((h >> np.uint64(33)) % np.uint64(buckets)).astype(np.int32)


def write_edges(path: str, u: np.ndarray, v: np.ndarray, buckets: int, store: Store | None = None) -> None:
    """Directed edges (u, v), tagged with u's bucket and sorted by it, committed atomically to
    ``path`` of ``store`` (None: the store of ``path``)."""
    b = bucket_of(u, buckets)
    idx = np.lexsort((v, u, b))
    out = writer(path, EDGE_SCHEMA, store or Store.from_url(path), row_group_size=_ROW_GROUP)  # a partition's: its block's file
    out.write(pa.table({"bucket": b[idx], "u": u[idx], "v": v[idx]}, schema=EDGE_SCHEMA))
    out.commit()


def read_bucket(files: list[str], bucket: int, store: Store | None = None) -> dict:
    flt = [("bucket", "=", bucket)]
    tables = [read_parquet(f, ["u", "v"], flt, store=store) for f in files]
    t = pa.concat_tables(tables) if tables else EDGE_SCHEMA.empty_table().select(["u", "v"])
    return {"u": t.column("u").to_numpy().astype(np.int64), "v": t.column("v").to_numpy().astype(np.int64)}


def fingerprint(hi: np.ndarray, lo: np.ndarray) -> tuple[int, int]:
    c = _checksum({"hi": hi, "lo": lo})
    return int(c["n"][0]), int(c["h"][0])


def _large_star_task(item: dict, store: Store) -> dict:
    e = read_bucket(item["inputs"], item["bucket"], store)
    out = large_star(e)
    write_edges(item["out"], out["hi"], out["lo"], item["buckets"], store)  # keyed by the larger end
    return {"edges": len(out["hi"])}


def _small_star_task(item: dict, store: Store) -> dict:
    e = read_bucket(item["inputs"], item["bucket"], store)
    out = small_star(e)
    hi, lo = out["hi"], out["lo"]
    # both directions, for the next round's large-star (keyed by each end)
    write_edges(item["out"], np.concatenate([hi, lo]), np.concatenate([lo, hi]), item["buckets"], store)
    n, h = fingerprint(hi, lo)
    return {"edges": n, "hash": str(h)}


def connected_components(runner, wd, stage: str, step: str, edge_files: list[str], buckets: int) -> list[str]:
    """Components of the undirected graph in ``edge_files`` (EDGE_SCHEMA, both directions, bucketed
    by ``u`` into ``buckets``). Returns files of directed edges in the same form whose rows with
    ``v < u`` map every non-root node ``u`` to its root ``v`` (the component's smallest node) and
    whose rows with ``v > u`` list each root's members. Every round's tasks commit markers, so a
    rerun resumes mid-round. ``runner.run(step, items, fn)`` runs ``fn(item)`` for each item
    (``pipeline.runner``); the rounds' files are ``stage``'s scratch files in the work dir ``wd``.
    """
    current, seen = list(edge_files), None
    for r in range(_MAX_ROUNDS):
        def items(kind):
            return [{"name": f"round-{r:03d}-{kind}-{b:05d}", "bucket": b, "buckets": buckets,
                     "out": wd.scratch(stage, f"components/round-{r:03d}", f"{kind}-{b:05d}")} for b in range(buckets)]

        ls = items("ls")
        runner.run(step, [{**it, "inputs": current} for it in ls], functools.partial(_large_star_task, store=wd.store))
        ss = items("ss")
        ls_files = [it["out"] for it in ls]
        stats = runner.run(step, [{**it, "inputs": ls_files} for it in ss], functools.partial(_small_star_task, store=wd.store))
        current = [it["out"] for it in ss]
        # small-star's output multiset depends only on the graph (each node's edges meet in one
        # task), so an equal fingerprint means a fixed point: one star per component.
        now = (sum(s["edges"] for s in stats), sum(int(s["hash"]) for s in stats) % (1 << 64))
        if now == seen:
            return current
        seen = now
    raise RuntimeError(f"connected components did not converge in {_MAX_ROUNDS} rounds")
