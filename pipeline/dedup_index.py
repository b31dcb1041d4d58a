"""Building a version's dedup index, and matching new documents against a published one.

The format (one row per kept document: id, exact key, MinHash sketch) is ``manifests.dedup_index``;
this module computes its rows from document text with fuzzy dedup's own MinHash
(``pipeline.minhash``, the job's ``fuzzy_dedup`` parameters), and finds, for new documents, the
earlier documents they duplicate:

- **exact**: equal 8-byte key (of exact dedup's ``norm_hash``, the blake2b of the normalised text)
  and equal sketch;
- **near**: a shared band of the sketches (LSH over the sketch bytes, the job's bands x rows), then
  the sketch estimate of the Jaccard at or above the threshold. The earlier text is not read, so
  this is the b-bit MinHash estimate (standard error ~0.037 at J = 0.8), not the exact Jaccard that
  verifies pairs inside one run; the earlier document with the highest estimate is named (ties: the
  earlier row of the index).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.manifests import dedup_index as dx
from gristmill.manifests.runs import run_starts

from .documents import norm_hash
from .minhash import MinHasher

if TYPE_CHECKING:  # the fuzzy_dedup section; the stages import this library, so not at run time
    from .stages.fuzzy_dedup.config import FuzzyDedupConfig


SKETCH_BITS = 4  # ~75 B a document in all; 8 bits would be ~140 B (docs/benchmarks.md measures its share of a version)


def index_params(cfg: FuzzyDedupConfig) -> dict:
    """The MinHash parameters an index written by a run with ``cfg`` records."""
    p = cfg.lsh()
    return {"ngram": cfg.ngram, "num_perm": cfg.num_perm, "seed": cfg.seed, "bands": p.bands, "rows": p.rows,
            "bits": SKETCH_BITS}


def check_comparable(mine: dict, params: dict, what: str) -> None:
    """Refuse to compare this run's documents (MinHash parameters ``mine``, ``index_params``) with an
    index of other parameters (their sketches would not be comparable), naming the key that differs."""
    from gristmill.errors import ConfigError

    for k in dx.PARAMS:
        if mine[k] != params[k]:
            raise ConfigError(f"fuzzy_dedup.{k}: {mine[k]} differs from the dedup index of {what} ({params[k]}); "
                              f"dedup against it with the same ngram, num_perm, seed, bands and rows")


def sketch_texts(texts: list[str], params: dict) -> tuple[np.ndarray, np.ndarray]:
    """Packed sketches of texts (``(n, dx.sketch_bytes(params))`` uint8) and which of them have words."""
    mh = MinHasher(num_perm=params["num_perm"], ngram=params["ngram"], seed=params["seed"])
    sh = mh.shingles(texts)
    return dx.sketches(mh.signatures_of(sh), params), sh.counts() > 0


def index_rows(params: dict, ids: list[str], texts: list[str], norm_hashes: list[str] | None = None) -> pa.Table:
    """The index rows of documents (``norm_hashes`` as exact dedup computed them, else from ``texts``)."""
    sk, has = sketch_texts(texts, params)
    return dx.table(params, ids, norm_hashes if norm_hashes is not None else [norm_hash(t) for t in texts], sk, has)


def _join(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j) with ``a[i] == b[j]`` (sort-merge; ``b`` may repeat keys)."""
    if not len(a) or not len(b):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ob = np.argsort(b, kind="stable")
    bs = b[ob]
    lo, hi = np.searchsorted(bs, a, "left"), np.searchsorted(bs, a, "right")
    n = hi - lo
    i = np.repeat(np.arange(len(a)), n)
    start = np.repeat(lo, n)
    offs = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    return i.astype(np.int64), ob[start + offs].astype(np.int64)


# -- join keys: what a new document and an earlier one must share to be compared ------------------
def exact_u64(keys) -> np.ndarray:
    """8-byte exact keys (a list of bytes, or an index's ``exact`` column) as uint64 (big-endian)."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        col = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        return np.frombuffer(col.buffers()[1], dtype=">u8", count=len(col), offset=col.offset * dx.EXACT_BYTES
                             ).astype(np.uint64)
    return np.frombuffer(b"".join(keys), dtype=">u8").astype(np.uint64) if len(keys) else np.zeros(0, np.uint64)


def doc_keys(exact: np.ndarray, sk: np.ndarray, has_words: np.ndarray, params: dict
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The join keys of documents, as rows ``(band, key, doc)``: one per document for its exact key
    (``band`` = ``params["bands"]``, ``key`` its 8-byte key) and, for a document with words, one
    per band of its sketch (``dx.sketch_band_keys``). Two documents are compared when they share a
    row's (band, key): an exact candidate on the exact band, a near candidate on a sketch band."""
    n, bands = len(exact), params["bands"]
    has = np.flatnonzero(np.asarray(has_words, bool))
    bk = dx.sketch_band_keys(sk[has], params) if len(has) else np.zeros((0, bands), np.uint64)
    band = np.concatenate([np.full(n, bands, np.int32), np.tile(np.arange(bands, dtype=np.int32), len(has))])
    key = np.concatenate([np.asarray(exact, np.uint64), bk.reshape(-1)])
    doc = np.concatenate([np.arange(n, dtype=np.int64), np.repeat(has.astype(np.int64), bands)])
    return band, key, doc


def key_bucket(band: np.ndarray, key: np.ndarray) -> np.ndarray:
    """The bucket (``0 .. 2**16``) of join-key rows: a mix of band and key, so the rows spread evenly
    over bucket ranges (a sketch band key is only ``rows * bits`` bits wide)."""
    h = (np.asarray(key, np.uint64) ^ (np.asarray(band, np.uint64) * np.uint64(0x9E3779B97F4A7C15))) \
        * np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(31)
    return (h >> np.uint64(48)).astype(np.int32)


def dedupe_pairs(i: np.ndarray, j: np.ndarray, exact: np.ndarray, near: np.ndarray):
    """Distinct ``(i, j)`` pairs sorted by (i, j), each with whether any of its rows was an exact
    key match and whether any was a shared sketch band."""
    if not len(i):
        return i.astype(np.int64), j.astype(np.int64), exact.astype(bool), near.astype(bool)
    o = np.lexsort((j, i))
    i, j, exact, near = i[o], j[o], np.asarray(exact, bool)[o], np.asarray(near, bool)[o]
    s = np.flatnonzero(run_starts(i, j))
    return i[s], j[s], np.logical_or.reduceat(exact, s), np.logical_or.reduceat(near, s)


def join_keys(new: tuple, old: tuple, exact_band: int):
    """The candidate pairs of two sets of join-key rows (``(band, key, ref)`` each): every new ref
    with every old ref sharing a (band, key), distinct, sorted, with their ``exact`` / ``near``
    flags (``dedupe_pairs``)."""
    nb, nk, nr = new
    ob, ok, orf = old
    out_i, out_j, out_e = [], [], []
    for b in np.unique(nb).tolist():
        mn, mo = np.flatnonzero(nb == b), np.flatnonzero(ob == b)
        a, c = _join(nk[mn], ok[mo])
        out_i.append(nr[mn[a]])
        out_j.append(orf[mo[c]])
        out_e.append(np.full(len(a), b == exact_band))
    if not out_i:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros(0, bool), np.zeros(0, bool)
    e = np.concatenate(out_e)
    return dedupe_pairs(np.concatenate(out_i).astype(np.int64), np.concatenate(out_j).astype(np.int64), e, ~e)


def resolve(params: dict, threshold: float, n: int, i: np.ndarray, j: np.ndarray, exact: np.ndarray,
            near: np.ndarray, sk: np.ndarray, has_words: np.ndarray, old_sk: np.ndarray, old_has: np.ndarray) -> dict:
    """The verdict for ``n`` new documents from their candidate pairs: pair k is new document
    ``i[k]`` (its sketch ``sk[i[k]]``) with the earlier document of index position ``j[k]`` (its
    sketch ``old_sk[k]``), flagged ``exact`` (equal exact key) and ``near`` (a shared sketch band).

    An exact match wins: equal key and an equal sketch (the same text has one), or both without
    words; the earliest such ``j``. Else the best near match: sketch estimate at or above
    ``threshold``, ties to the earliest ``j``. Returns ``{"pair": int64 (-1: none), "row": the
    matched j (-1), "kind": "exact" | "near" | "", "similarity": float}``."""
    pair = np.full(n, -1, np.int64)
    kind = np.array([""] * n, dtype=object)
    sim = np.zeros(n, np.float64)
    has_words = np.asarray(has_words, bool)
    old_has = np.asarray(old_has, bool)
    if len(i):
        hi = has_words[i]
        ok = exact & (hi == old_has) & (~hi | np.all(sk[i] == old_sk, axis=1))
        k = np.flatnonzero(ok)
        k = k[np.lexsort((j[k], i[k]))]
        first = np.ones(len(k), bool)
        first[1:] = i[k[1:]] != i[k[:-1]]
        k = k[first]
        pair[i[k]], kind[i[k]], sim[i[k]] = k, "exact", 1.0
        k = np.flatnonzero(near & (pair[i] < 0) & hi & old_has)
        if len(k):
            est = dx.estimate(sk[i[k]], old_sk[k], params)
            keep = est >= threshold
            k, est = k[keep], est[keep]
            o = np.lexsort((j[k], -est, i[k]))  # per new doc: best estimate, then earliest row
            k, est = k[o], est[o]
            first = np.ones(len(k), bool)
            first[1:] = i[k[1:]] != i[k[:-1]]
            k, est = k[first], est[first]
            pair[i[k]], kind[i[k]], sim[i[k]] = k, "near", est
    row = np.where(pair >= 0, j[np.maximum(pair, 0)] if len(j) else -1, -1).astype(np.int64)
    return {"pair": pair, "row": row, "kind": kind, "similarity": sim}


def match(params: dict, threshold: float, exact: list[bytes], sk: np.ndarray, has_words: np.ndarray,
          index: pa.Table) -> dict:
    """For each new document (its exact key, sketch, and whether it has words), the index row it
    duplicates: ``{"row": int64 (-1: none), "kind": "exact" | "near" | "", "similarity": float}``.
    An exact match wins (similarity 1.0); else the best near match at or above ``threshold``.

    In memory, the whole index at once: the same join keys, pairs and verdicts as the bucketed
    steps of ``dedup_against`` (which split the same work over bucket ranges and index files)."""
    n = len(exact)
    isk, ihas = dx.sketch_matrix(index.column("sketch"), dx.sketch_bytes(params)) if index.num_rows else \
        (np.zeros((0, dx.sketch_bytes(params)), np.uint8), np.zeros(0, bool))
    new = doc_keys(exact_u64(exact), sk, has_words, params)
    old = doc_keys(exact_u64(index.column("exact")), isk, ihas, params) if index.num_rows else \
        (np.zeros(0, np.int32), np.zeros(0, np.uint64), np.zeros(0, np.int64))
    i, j, ex, nr = join_keys(new, old, params["bands"])
    v = resolve(params, threshold, n, i, j, ex, nr, sk, has_words, isk[j], ihas[j])
    return {"row": v["row"], "kind": v["kind"], "similarity": v["similarity"]}


# -- tasks of the dedup_index stage (pipeline/stages/dedup_index.py) ----------------------------------
STAGE = "dedup_index"
INDEX_DIR = STAGE  # inside the staging dir: published beside shards/ and doc_index.parquet


ROWS_PER_FILE = 1 << 18  # index rows per published file (~20 MB): the file count comes from the data; a
# dedup_against.keys task holds one file's rows and their 22 join-key rows each (~150 MB at 2**18)


def index_file(k: int) -> str:
    """The k-th published index file, relative to the version directory."""
    return f"{INDEX_DIR}/part-{k:05d}.parquet"


def _id_hash(ids: list[str]) -> np.ndarray:
    """A 63-bit hash of each document id (an int64 Parquet filters compare): which published file
    a document's row goes to."""
    import hashlib

    return np.array([int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "big") >> 1 for i in ids],
                    np.int64)


def index_task(item: dict, wd, survivors, params: dict, batch_size: int) -> dict:
    """Partition ``item["part"]``'s index rows: every document still in the run at the end (the
    version's documents), its exact key as exact dedup compared it and the sketch of its text as
    fuzzy dedup compared it; tagged with the hash of its id and sorted by it (``merge_task`` reads
    hash ranges), in the work dir."""
    part, tables = item["part"], []
    for t in survivors.docs(part, ["id", "text", "norm_hash"], batch_size):
        ids = t.column("id").to_pylist()
        rows = index_rows(params, ids, t.column("text").to_pylist(), t.column("norm_hash").to_pylist())
        tables.append(rows.replace_schema_metadata(None).append_column("id_hash", pa.array(_id_hash(ids), pa.int64())))
    t = pa.concat_tables(tables) if tables else \
        dx.schema(params).empty_table().replace_schema_metadata(None).append_column("id_hash", pa.array([], pa.int64()))
    out = wd.part(wd.part_scratch(INDEX_DIR, "parts", part), t.schema, row_group_size=65_536)
    out.write(t.sort_by("id_hash"))
    out.commit()
    return {"rows": t.num_rows}


def plan_files(rows: int) -> list[dict]:
    """The published files: enough that none holds more than ROWS_PER_FILE rows; file k takes the
    documents whose id hash falls in the k-th of equal ranges of [0, 2**63). A function of the
    row count alone, so the same documents give the same files whatever the partitioning."""
    n = max(1, -(-rows // ROWS_PER_FILE))
    edges = [(k << 63) // n for k in range(n + 1)]
    return [{"name": f"file-{k:05d}", "k": k, "lo": edges[k], "hi": edges[k + 1]} for k in range(n)]


def merge_task(item: dict, wd, files: list[str], params: dict) -> dict:
    """Published index file ``item["k"]``: its hash range's rows of every partition (``files``: the
    block files ``index_task`` wrote), sorted by
    document id (unique), written in fixed row groups into the staging dir: equal documents, equal
    bytes. The stats pin it for the manifest."""
    import os

    from gristmill.manifests.hashing import sha256_file

    flt = [("id_hash", ">=", item["lo"])] + ([("id_hash", "<", item["hi"])] if item["hi"] < 1 << 63 else [])
    tables = [wd.read_parquet(f, filters=flt) for f in files]
    s = dx.schema(params)
    t = pa.concat_tables([x.drop_columns(["id_hash"]).cast(s) for x in tables]) if tables else s.empty_table()
    rel = index_file(item["k"])
    path = os.path.join(wd.staging, rel)
    rows = dx.write(path, t.sort_by("doc_id").replace_schema_metadata(s.metadata), wd.store)
    sha, size = sha256_file(path, store=wd.store)
    return {"path": rel, "sha256": sha, "bytes": size, "rows": rows}


def load_index_file(url: str, ref, params: dict, label: str, out: str, storage_options: dict | None = None,
                    out_store=None) -> pa.Table:
    """One index file of an earlier version, read from its store, hash-checked against the manifest
    entry that pins it (``ref``, a ``manifests.FileRef``) and its MinHash parameters against this
    run's, then kept at ``out`` of ``out_store`` (the work dir's; None: the store of ``out``) for the
    later steps (a file already there with the pinned hash is not read from the store again).
    Returns its rows (without the file's metadata)."""
    from gristmill.manifests.hashing import sha256_bytes
    from gristmill.manifests.storage import Store

    out_store = out_store or Store.from_url(out)
    try:
        kept = out_store.read(out)
    except FileNotFoundError:
        kept = None
    if kept is not None and sha256_bytes(kept) == ref.sha256:
        data = kept
    else:
        data = Store.from_url(url, **(storage_options or {})).read(url)
    t, theirs = dx.read_checked(data, ref, url)
    check_comparable(params, theirs, label)
    if data is not kept:
        out_store.put(out, data)  # the verified bytes, as published
    return t.replace_schema_metadata(None)


def earlier_document_text(url: str, sha256: str, doc_id: str) -> str | None:
    """The text of document ``doc_id`` as version ``url`` (pinned by ``sha256``) published it: its
    token spans (document index) read from the shards, each hash-checked, and decoded with the
    version's own tokenizer. None when the version has no such document. What ``gristmill inspect
    removed`` shows beside a document removed as a duplicate of an earlier version's."""
    from tokenizers import Tokenizer

    from gristmill.manifests import join, load_manifest
    from gristmill.manifests.doc_index import read_published_doc_index
    from gristmill.manifests.errors import HashMismatchError
    from gristmill.manifests.hashing import sha256_bytes
    from gristmill.manifests.storage import Store
    from gristmill.manifests.verify import verified_rows

    pub = load_manifest(url, expected_sha256=sha256)
    m = pub.manifest
    spans = read_published_doc_index(pub, columns=["shard", "row", "start", "length"], filters=[("doc_id", "=", doc_id)])
    if not spans.num_rows:
        return None
    data = Store.from_url(pub.url).read(join(pub.url, m.tokenizer.path))
    if sha256_bytes(data) != m.tokenizer.sha256:
        raise HashMismatchError(join(pub.url, m.tokenizer.path), m.tokenizer.sha256, sha256_bytes(data))
    tok = Tokenizer.from_str(data.decode())
    ids, rows = [], {}
    for s, r, start, n in zip(*(spans.column(c).to_pylist() for c in ("shard", "row", "start", "length"))):
        if s not in rows:
            rows[s] = verified_rows(pub, m.shards[s])
        ids += rows[s][r, start:start + n].tolist()
    return tok.decode([i for i in ids if i != m.tokenizer.eos_id])
