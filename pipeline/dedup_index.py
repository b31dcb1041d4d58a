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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.manifests import dedup_index as dx

from .config import FuzzyDedupConfig
from .documents import norm_hash
from .minhash import MinHasher
from .workdir import read_parquet


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


def match(params: dict, threshold: float, exact: list[bytes], sk: np.ndarray, has_words: np.ndarray,
          index: pa.Table) -> dict:
    """For each new document (its exact key, sketch, and whether it has words), the index row it
    duplicates: ``{"row": int64 (-1: none), "kind": "exact" | "near" | "", "similarity": float}``.
    An exact match wins (similarity 1.0); else the best near match at or above ``threshold``."""
    n = len(exact)
    row = np.full(n, -1, np.int64)
    kind = np.array([""] * n, dtype=object)
    sim = np.zeros(n, np.float64)
    if not n or not index.num_rows:
        return {"row": row, "kind": kind, "similarity": sim}
    isk, ihas = dx.sketch_matrix(index.column("sketch"), dx.sketch_bytes(params))
    # exact: equal key and an equal sketch (the same text has one), or both without words
    key_dtype = f"S{dx.EXACT_BYTES}"
    new_k = np.array(exact, dtype=key_dtype)
    old_k = np.array(index.column("exact").to_pylist(), dtype=key_dtype)
    i, j = _join(new_k, old_k)
    has_words = np.asarray(has_words, bool)
    same = (has_words[i] == ihas[j]) & (~has_words[i] | np.all(sk[i] == isk[j], axis=1)) if len(i) else np.zeros(0, bool)
    i, j = i[same], j[same]
    if len(i):
        order = np.lexsort((j, i))
        i, j = i[order], j[order]
        first = np.ones(len(i), bool)
        first[1:] = i[1:] != i[:-1]
        i, j = i[first], j[first]  # the earliest index row with the key
        row[i], kind[i], sim[i] = j, "exact", 1.0
    # near: LSH over the sketch bytes, then the estimate
    todo = (row < 0) & np.asarray(has_words, bool)
    if not todo.any() or not ihas.any():
        return {"row": row, "kind": kind, "similarity": sim}
    new_idx = np.flatnonzero(todo)
    old_idx = np.flatnonzero(ihas)
    nk = dx.sketch_band_keys(sk[new_idx], params)
    ok = dx.sketch_band_keys(isk[old_idx], params)
    pairs = []
    for b in range(params["bands"]):
        a_, b_ = _join(nk[:, b], ok[:, b])
        pairs.append(np.stack([new_idx[a_], old_idx[b_]], axis=1))
    cand = np.unique(np.concatenate(pairs), axis=0)
    if len(cand):
        est = dx.estimate(sk[cand[:, 0]], isk[cand[:, 1]], params)
        keep = est >= threshold
        cand, est = cand[keep], est[keep]
        order = np.lexsort((cand[:, 1], -est, cand[:, 0]))  # per new doc: best estimate, then earliest row
        cand, est = cand[order], est[order]
        first = np.ones(len(cand), bool)
        first[1:] = cand[1:, 0] != cand[:-1, 0]
        d, o, e = cand[first, 0], cand[first, 1], est[first]
        row[d], kind[d], sim[d] = o, "near", e
    return {"row": row, "kind": kind, "similarity": sim}


# -- tasks (the dedup_index and dedup_against stages, pipeline/stages/) -----------------------------
INDEX_DIR = "dedup_index"  # inside the staging dir: published beside shards/ and doc_index.parquet
AGAINST = "dedup_against"
REASONS = {"exact": "earlier_exact_duplicate", "near": "earlier_near_duplicate"}


ROWS_PER_FILE = 4_000_000  # index rows per published file (~300 MB): the file count comes from the data


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
    from .workdir import ParquetPart

    out = ParquetPart(wd.scratch(INDEX_DIR, "parts", item["name"]), t.schema, row_group_size=65_536)
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


def merge_task(item: dict, wd, parts: list[str], params: dict) -> dict:
    """Published index file ``item["k"]``: its hash range's rows of every partition's file, sorted by
    document id (unique), written in fixed row groups into the staging dir: equal documents, equal
    bytes. The stats pin it for the manifest."""
    import os

    from gristmill.manifests.hashing import sha256_file

    flt = [("id_hash", ">=", item["lo"])] + ([("id_hash", "<", item["hi"])] if item["hi"] < 1 << 63 else [])
    tables = [read_parquet(wd.scratch(INDEX_DIR, "parts", p), filters=flt) for p in parts]
    s = dx.schema(params)
    t = pa.concat_tables([x.drop_columns(["id_hash"]).cast(s) for x in tables]) if tables else s.empty_table()
    rel = index_file(item["k"])
    path = os.path.join(wd.staging, rel)
    rows = dx.write(path, t.sort_by("doc_id").replace_schema_metadata(s.metadata))
    sha, size = sha256_file(path)
    return {"path": rel, "sha256": sha, "bytes": size, "rows": rows}


def load_index_file(url: str, ref, params: dict, label: str, out: str, storage_options: dict | None = None) -> int:
    """One index file of an earlier version, read from its store, hash-checked against the manifest
    entry that pins it (``ref``, a ``manifests.FileRef``) and its MinHash parameters against this
    run's, then kept at ``out`` in the work dir for the match tasks (a file already there with the
    pinned hash is not read again). Returns its rows."""
    import os

    import fsspec

    from gristmill.manifests.hashing import sha256_file
    from gristmill.manifests.shards import atomic_write

    if os.path.exists(out) and sha256_file(out)[0] == ref.sha256:
        return ref.rows if ref.rows is not None else pq.ParquetFile(out).metadata.num_rows
    with fsspec.open(url, "rb", **(storage_options or {})) as f:
        data = f.read()
    t, theirs = dx.read_checked(data, ref, url)
    check_comparable(params, theirs, label)
    atomic_write(out, data)  # the verified bytes, as published
    return t.num_rows


def match_task(item: dict, wd, survivors, params: dict, threshold: float, sources: list[dict], batch_size: int) -> dict:
    """Partition ``item["part"]``'s documents that exactly or nearly duplicate a document of an
    earlier version: ``removed/dedup_against/part-N`` naming the earlier version and document.
    ``sources``: the loaded index files in order, each ``{"name", "version", "url", "sha256"}``."""
    from .documents import REMOVED_SCHEMA, to_removed_rows
    from .workdir import ParquetPart

    parts, labels = [], []
    for k, s in enumerate(sources):
        t = pq.read_table(wd.scratch(AGAINST, "index", s["name"])).replace_schema_metadata(None)
        parts.append(t)
        labels.append(np.full(t.num_rows, k, np.int32))
    index = pa.concat_tables(parts) if parts else dx.schema(params).empty_table().replace_schema_metadata(None)
    label = np.concatenate(labels) if labels else np.zeros(0, np.int32)
    old_ids = index.column("doc_id").to_pylist()
    docs_in = bytes_in = 0
    rows = {k: [] for k in ("id", "order", "bytes", "reason", "duplicate_of", "earlier_version", "earlier_url",
                            "earlier_sha256", "similarity")}
    for t in survivors.docs(item["part"], ["id", "order", "text", "norm_hash", "bytes"], batch_size):
        docs_in += t.num_rows
        bytes_in += int(sum(t.column("bytes").to_pylist()))
        sk, has = sketch_texts(t.column("text").to_pylist(), params)
        m = match(params, threshold, dx.exact_keys(t.column("norm_hash").to_pylist()), sk, has, index)
        hit = np.flatnonzero(m["row"] >= 0)
        ids, orders, nbytes = (t.column(c).to_pylist() for c in ("id", "order", "bytes"))
        for i in hit.tolist():
            r = int(m["row"][i])
            src = sources[int(label[r])]
            rows["id"].append(ids[i])
            rows["order"].append(orders[i])
            rows["bytes"].append(nbytes[i])
            rows["reason"].append(REASONS[m["kind"][i]])
            rows["duplicate_of"].append(old_ids[r])
            rows["earlier_version"].append(src["version"])
            rows["earlier_url"].append(src["url"])
            rows["earlier_sha256"].append(src["sha256"])
            rows["similarity"].append(round(float(m["similarity"][i]), 6))
    out = ParquetPart(wd.removed(AGAINST, item["part"]), REMOVED_SCHEMA)
    removed = pa.table(rows) if rows["id"] else None
    out.write(to_removed_rows(removed, AGAINST) if removed is not None else REMOVED_SCHEMA.empty_table())
    out.commit()
    by_reason: dict[str, int] = {}
    for r in rows["reason"]:
        by_reason[r] = by_reason.get(r, 0) + 1
    return {"documents_in": docs_in, "bytes_in": bytes_in, "removed": by_reason,
            "removed_bytes": int(sum(rows["bytes"])), "index_rows": index.num_rows}


def earlier_document_text(url: str, sha256: str, doc_id: str) -> str | None:
    """The text of document ``doc_id`` as version ``url`` (pinned by ``sha256``) published it: its
    token spans (document index) read from the shards, each hash-checked, and decoded with the
    version's own tokenizer. None when the version has no such document. What ``gristmill inspect
    removed`` shows beside a document removed as a duplicate of an earlier version's."""
    import fsspec
    from tokenizers import Tokenizer

    from gristmill.manifests import join, load_manifest
    from gristmill.manifests.doc_index import read_published_doc_index
    from gristmill.manifests.errors import HashMismatchError
    from gristmill.manifests.hashing import sha256_bytes
    from gristmill.manifests.verify import verified_rows

    pub = load_manifest(url, expected_sha256=sha256)
    m = pub.manifest
    spans = read_published_doc_index(pub, columns=["shard", "row", "start", "length"], filters=[("doc_id", "=", doc_id)])
    if not spans.num_rows:
        return None
    with fsspec.open(join(pub.url, m.tokenizer.path), "rb") as f:
        data = f.read()
    if sha256_bytes(data) != m.tokenizer.sha256:
        raise HashMismatchError(join(pub.url, m.tokenizer.path), m.tokenizer.sha256, sha256_bytes(data))
    tok = Tokenizer.from_str(data.decode())
    ids, rows = [], {}
    for s, r, start, n in zip(*(spans.column(c).to_pylist() for c in ("shard", "row", "start", "length"))):
        if s not in rows:
            rows[s] = verified_rows(pub, m.shards[s])
        ids += rows[s][r, start:start + n].tolist()
    return tok.decode([i for i in ids if i != m.tokenizer.eos_id])
