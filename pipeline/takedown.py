"""Takedowns: find requested documents and their copies in a published version, and publish a new
version without them, rewriting only the shards they lived in.

**Finding** (:func:`find_documents`). A request names documents by id, by URL (the document index's
``url`` column) or by a text passage. Each requested document or passage is compared with every
document of the version's dedup index (``manifests.dedup_index``: an exact key and a b-bit MinHash
sketch per document, made by fuzzy dedup's own MinHash), so copies are found without the text:

- an **exact copy**: the same 8-byte key of the normalised text (and, for a requested document,
  the same sketch: a key collision alone removes nothing, as in `dedup_against`);
- a **near copy**: a shared LSH band of the sketches, then the sketch's Jaccard estimate at or
  above the version's own fuzzy-dedup threshold (``config.fuzzy_dedup.threshold``; the stage's
  default where the version was made without the stage). A document a run kept because fuzzy
  dedup was off, or one that escaped it, is found here.

**Rebuilding** (:func:`publish_without`). Shards holding no removed document are reused as they
are (the same bytes, the same manifest entry, copied by the store: a hard link on a local disk,
a server-side copy on an object store). A shard that held one is repacked: its tokens without the
removed documents' spans, cut into rows again, its last partial row dropped and counted
(``tokens_dropped_tail``), as the pack stage drops a range's tail; a shard left without a whole row
is dropped from the version. The document index is rewritten (spans moved with their tokens,
shard positions renumbered), the dedup index files that held a removed document are rewritten
without its row, the others reused. The new manifest is the parent's with those files, and
``stats.takedown``: the parent version (url, version, sha256), the request, and every removed
document with why (docs/format.md).
"""
from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.errors import UsageError
from gristmill.manifests import FileRef, ManifestStore, Published
from gristmill.manifests import dedup_index as dx
from gristmill.manifests.builder import DOC_INDEX_FILE, write_pinned_shard
from gristmill.manifests.doc_index import DocIndexWriter, read_published_doc_index
from gristmill.manifests.errors import HashMismatchError
from gristmill.manifests.hashing import sha256_bytes, sha256_file
from gristmill.manifests.runs import run_starts
from gristmill.manifests.shards import read_table, rows_from_table
from gristmill.manifests.storage import Store
from gristmill.manifests.store import join

from .dedup_index import exact_u64, sketch_texts
from .documents import norm_hash


@dataclass(frozen=True)
class Request:
    """What a takedown asks for: documents by id or URL, passages of text, and why (free text)."""

    doc_ids: tuple[str, ...] = ()
    urls: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    reason: str = "takedown request"

    def to_dict(self) -> dict:
        return {"doc_ids": list(self.doc_ids), "urls": list(self.urls), "texts": len(self.texts), "reason": self.reason}


KEPT_FLOOR = 0.5  # a reviewer sees the candidates the threshold kept down to this estimated Jaccard
REMOVAL_SCHEMA = pa.schema([("doc_id", pa.string()), ("match", pa.string()), ("target", pa.string()),
                            ("similarity", pa.float64())])


@dataclass(frozen=True)
class Found:
    """The documents a request matches: one row per removed document (``REMOVAL_SCHEMA``: ``match`` is
    ``requested`` (by id or URL), ``exact copy`` or ``near copy``; ``target`` the requested id, URL or
    ``text #k``; ``similarity`` the sketch's Jaccard estimate for a near copy), and what was not found."""

    removals: pa.Table
    not_found: list[str]
    threshold: float
    params: dict = field(default_factory=dict)
    kept: list[dict] = field(default_factory=list)  # near candidates below the threshold (estimate >= KEPT_FLOOR): shown, not removed

    @property
    def doc_ids(self) -> list[str]:
        return self.removals.column("doc_id").to_pylist()


def version_threshold(published: Published) -> float:
    """The Jaccard threshold the version's fuzzy dedup used (its stage default when it did not run)."""
    from .stages.fuzzy_dedup.config import FuzzyDedupConfig

    section = published.manifest.config.get("fuzzy_dedup") if isinstance(published.manifest.config, dict) else None
    value = section.get("threshold") if isinstance(section, dict) else None
    return float(value) if isinstance(value, (int, float)) and 0 < value < 1 else FuzzyDedupConfig().threshold


def find_documents(published: Published, request: Request, threshold: float | None = None) -> Found:
    """The documents of ``published`` that ``request`` names, and their exact and near copies."""
    threshold = version_threshold(published) if threshold is None else threshold
    index, params = dx.read_published(published)
    ids = index.column("doc_id").combine_chunks()
    exact = exact_u64(index.column("exact"))
    sk, has = dx.sketch_matrix(index.column("sketch"), dx.sketch_bytes(params))
    targets, not_found = [], []  # (label, index position or -1, sketch, has words, exact key)
    pos = pc.index_in(pa.array(list(request.doc_ids), pa.string()), value_set=ids).to_pylist()
    for doc_id, p in zip(request.doc_ids, pos):
        if p is None:
            not_found.append(f"id {doc_id}")
        else:
            targets.append((doc_id, "requested", p, sk[p], has[p], exact[p]))
    if request.urls:
        spans = read_published_doc_index(published, columns=["doc_id", "url"])
        for url in request.urls:
            hits = pc.unique(spans.filter(pc.equal(spans.column("url"), url)).column("doc_id")).to_pylist()
            not_found += [] if hits else [f"url {url}"]
            for p, doc_id in zip(pc.index_in(pa.array(hits, pa.string()), value_set=ids).to_pylist(), hits):
                targets.append((url, "requested", p, sk[p], has[p], exact[p]))
    if request.texts:
        tsk, thas = sketch_texts(list(request.texts), params)
        tex = exact_u64(dx.exact_keys([norm_hash(t) for t in request.texts]))
        targets += [(f"text #{k + 1}", "text", -1, tsk[k], thas[k], tex[k]) for k in range(len(request.texts))]
    band_keys = dx.sketch_band_keys(sk, params)
    best: dict[int, tuple] = {}  # index position -> (match, target, similarity): the strongest reason wins
    kept: dict[int, tuple] = {}  # candidates below the threshold: (target, similarity)
    for label, kind, p, tsk, thas, tex in targets:
        if p >= 0:
            best[p] = ("requested", label, None)
        same = exact == tex
        if p >= 0:  # a requested document's exact copies: key and sketch equal (a key collision removes nothing)
            same &= (sk == tsk).all(axis=1) & (has == thas)
        near = np.zeros(len(ids), bool)
        if thas:
            cand = np.flatnonzero(has & (band_keys == dx.sketch_band_keys(tsk[None, :], params)).any(axis=1))
            est = dx.estimate(sk[cand], np.broadcast_to(tsk, (len(cand), len(tsk))), params)
            near[cand[est >= threshold]] = True
            similarity = dict(zip(cand.tolist(), est.tolist()))
            for q in cand[(est < threshold) & (est >= KEPT_FLOOR)].tolist():
                if similarity[q] > kept.get(q, ("", -1.0))[1]:
                    kept[q] = (label, round(similarity[q], 4))
        for q in np.flatnonzero(same | near).tolist():
            reason = ("exact copy", label, 1.0) if same[q] else ("near copy", label, round(similarity[q], 4))
            if q not in best or _rank(reason) > _rank(best[q]):
                best[q] = reason
    order = sorted(best)
    removals = pa.table({"doc_id": ids.take(pa.array(order, pa.int64())) if order else pa.array([], pa.string()),
                         "match": [best[q][0] for q in order], "target": [best[q][1] for q in order],
                         "similarity": pa.array([best[q][2] for q in order], pa.float64())}, schema=REMOVAL_SCHEMA)
    kept_rows = [{"doc_id": ids[q].as_py(), "target": t, "similarity": sim} for q, (t, sim) in sorted(kept.items())
                 if q not in best]
    return Found(removals.sort_by("doc_id"), not_found, threshold, params, sorted(kept_rows, key=lambda r: r["doc_id"]))


def _rank(reason: tuple) -> tuple:
    kinds = ("near copy", "exact copy", "requested")
    return kinds.index(reason[0]), reason[2] or 0.0


# -- the new version ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rebuilt:
    published: Published
    rewritten: list[str]  # shard paths rewritten (each held a removed document)
    dropped: list[str]  # shard paths left out (no whole row remained)
    reused: list[str]  # shard paths reused byte for byte
    tokens_removed: int
    tokens_dropped_tail: int
    dedup_files_rewritten: list[str]


def store_root(published: Published) -> str:
    """The manifest store a version lives in (``<root>/<dataset>/v<N>`` -> ``<root>``)."""
    return published.url.rstrip("/").rsplit("/", 2)[0]


def publish_without(published: Published, found: Found, request: Request, *, reason_detail: dict | None = None
                    ) -> Rebuilt:
    """Publish the version ``published`` less ``found``'s documents as the dataset's next version."""
    m = published.manifest
    remove = pa.array(sorted(set(found.doc_ids)), pa.string())
    if not len(remove):
        raise UsageError("takedown: no document matched the request; nothing to publish")
    store = published.store or Store.from_url(published.url)
    root = store_root(published)
    staging = join(root, m.dataset, f".takedown-{uuid.uuid4().hex[:12]}")
    try:
        spans = read_published_doc_index(published)
        gone = np.asarray(pc.is_in(spans.column("doc_id"), value_set=remove).to_numpy(zero_copy_only=False), bool)
        shard_col = spans.column("shard").to_numpy().astype(np.int64)
        affected = set(np.unique(shard_col[gone]).tolist())
        new_pos, shards, pieces, stats = {}, [], [], {"rewritten": [], "dropped": [], "reused": [], "removed": 0, "tail": 0}
        for i, shard in enumerate(m.shards):
            sel = np.flatnonzero(shard_col == i)
            if i not in affected:
                _reuse(store, join(published.url, shard.path), join(staging, shard.path))
                new_pos[i] = len(shards)
                shards.append(shard)
                stats["reused"].append(shard.path)
                pieces.append((i, spans.take(pa.array(sel))))
                continue
            rows, kept = _repack(store, published, shard, spans.take(pa.array(sel)), gone[sel], m.row_tokens, stats,
                                 _goes_on(spans, shard_col, m, i))
            if len(rows) == 0:
                stats["dropped"].append(shard.path)
                continue
            new_pos[i] = len(shards)
            shards.append(write_pinned_shard(staging, shard.path, shard.split, rows.astype(m.token_dtype), store))
            stats["rewritten"].append(shard.path)
            pieces.append((i, kept))
        loose = pa.schema([f.with_nullable(True) for f in spans.schema])  # moved spans are built, not read
        index = pa.concat_tables([t.set_column(0, "shard", pa.array(np.full(t.num_rows, new_pos[i], np.int32))).cast(loose)
                                  for i, t in pieces if t.num_rows])
        index = index.sort_by([("shard", "ascending"), ("row", "ascending"), ("start", "ascending")])
        doc_index_path = join(staging, DOC_INDEX_FILE)
        with DocIndexWriter(doc_index_path, store) as w:
            w.write(index)
        sha, size = sha256_file(doc_index_path, store=store)
        dedup, dedup_rewritten = _dedup_files(store, published, staging, remove)
        _reuse(store, join(published.url, m.tokenizer.path), join(staging, m.tokenizer.path))
        record = {"parent": {"url": published.url, "dataset": m.dataset, "version": m.version, "sha256": m.sha256},
                  "request": request.to_dict(), "threshold": found.threshold,
                  "removed": found.removals.to_pylist(), "documents_removed": len(remove),
                  "tokens_removed": stats["removed"], "tokens_dropped_tail": stats["tail"],
                  "shards_rewritten": stats["rewritten"], "shards_dropped": stats["dropped"],
                  "shards_reused": len(stats["reused"]), **(reason_detail or {})}
        manifest = replace(m, shards=tuple(shards), doc_index=FileRef(DOC_INDEX_FILE, sha, size, w.rows),
                           dedup_index=tuple(dedup), stats={**m.stats, "takedown": record}, version=None, created_at=None)
        new = ManifestStore(root).publish(manifest, staging, files_store=store)
    finally:
        _remove_tree(store, staging)
    return Rebuilt(new, stats["rewritten"], stats["dropped"], stats["reused"], stats["removed"], stats["tail"],
                   dedup_rewritten)


def _goes_on(spans: pa.Table, shard_col: np.ndarray, m, i: int) -> bool:
    """Whether shard ``i``'s last document goes on at the very start of the next shard of its split."""
    here, nxt = np.flatnonzero(shard_col == i), np.flatnonzero(shard_col == i + 1)
    if not len(here) or not len(nxt) or m.shards[i + 1].split != m.shards[i].split:
        return False
    first = spans.slice(int(nxt[0]), 1).to_pylist()[0]
    return first["row"] == 0 and first["start"] == 0 and first["doc_id"] == spans.column("doc_id")[int(here[-1])].as_py()


def _read_shard(store: Store, published: Published, shard) -> np.ndarray:
    url = join(published.url, shard.path)
    data = store.read(url)
    actual = sha256_bytes(data)
    if actual != shard.sha256:
        raise HashMismatchError(url, shard.sha256, actual)
    return rows_from_table(read_table(pa.py_buffer(data)), url)


def _repack(store: Store, published: Published, shard, spans: pa.Table, gone: np.ndarray, width: int, stats: dict,
            continues: bool):
    """The shard's rows without the removed spans and its document index spans, moved. The kept tokens
    rarely fill whole rows: the remainder is dropped where it makes no hole in a document. When the
    shard's last document goes on into the next shard (``continues``), from that document's start here
    (it reads as a document whose beginning is elsewhere); otherwise from the end (the pack stage's
    dropped tail)."""
    flat = _read_shard(store, published, shard).reshape(-1)
    row, start = spans.column("row").to_numpy().astype(np.int64), spans.column("start").to_numpy().astype(np.int64)
    length = spans.column("length").to_numpy().astype(np.int64)
    a = row * width + start
    delta = np.zeros(len(flat) + 1, np.int64)
    np.add.at(delta, a[gone], 1)
    np.add.at(delta, a[gone] + length[gone], -1)
    keep = np.cumsum(delta[:-1]) == 0
    stats["removed"] += int((~keep).sum())
    after_removal = int(keep.sum())
    extra = after_removal % width
    if continues and extra and len(spans) and not gone[-1]:
        last_doc = spans.column("doc_id")[len(spans) - 1]
        mine = np.flatnonzero(~gone & pc.equal(spans.column("doc_id"), last_doc).to_numpy(zero_copy_only=False))
        tokens = np.concatenate([np.arange(a[k], a[k] + length[k]) for k in mine])
        cut = tokens[:extra]
        keep[cut] = False
        extra -= len(cut)
    kept_total = int(keep.sum())
    n_rows = kept_total // width
    limit = n_rows * width
    stats["tail"] += after_removal - limit
    before = np.concatenate([[0], np.cumsum(keep)])  # kept tokens before each old position
    ka, kl = before[a], before[a + length] - before[a]
    live_span = ~gone & (kl > 0)
    ka, kl = ka[live_span], kl[live_span]
    survivors = spans.filter(pa.array(live_span))
    # Consecutive spans of one document that now touch are one piece (a document's tokens are contiguous).
    doc = survivors.column("doc_id").to_numpy(zero_copy_only=False)
    first = run_starts(doc) | np.concatenate([[True], ka[1:] != ka[:-1] + kl[:-1]])[:len(doc)]
    starts = np.flatnonzero(first)
    pa_ = ka[starts]
    pb = np.minimum(pa_ + (np.add.reduceat(kl, starts) if len(starts) else 0), limit)
    live = pa_ < pb
    starts, pa_, pb = starts[live], pa_[live], pb[live]
    first_row, last_row = pa_ // width, (pb - 1) // width
    n = last_row - first_row + 1
    piece = np.repeat(np.arange(len(starts)), n)
    r = np.repeat(first_row, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    s = np.maximum(pa_[piece], r * width)
    e = np.minimum(pb[piece], (r + 1) * width)
    meta = survivors.take(pa.array(starts[piece]))
    moved = meta.set_column(meta.schema.get_field_index("row"), "row", pa.array(r, pa.int64())) \
        .set_column(meta.schema.get_field_index("start"), "start", pa.array(s - r * width, pa.int32())) \
        .set_column(meta.schema.get_field_index("length"), "length", pa.array(e - s, pa.int32()))
    return flat[keep][:limit].reshape(n_rows, width), moved


def _dedup_files(store: Store, published: Published, staging: str, remove: pa.Array) -> tuple[list, list]:
    out, rewritten = [], []
    for ref in published.manifest.dedup_index:
        src = join(published.url, ref.path)
        table, _ = dx.read_checked(store.read(src), ref, src)
        hit = pc.is_in(table.column("doc_id"), value_set=remove)
        if not pc.any(hit).as_py():
            _reuse(store, src, join(staging, ref.path))
            out.append(ref)
            continue
        path = join(staging, ref.path)
        rows = dx.write(path, table.filter(pc.invert(hit)), store)
        sha, size = sha256_file(path, store=store)
        out.append(FileRef(ref.path, sha, size, rows))
        rewritten.append(ref.path)
    return out, rewritten


def _reuse(store: Store, src: str, dst: str) -> None:
    """``dst`` the same bytes as ``src`` without reading them here: a hard link on a local disk (the
    publish then copies it in the kernel), a server-side copy on an object store."""
    if store.is_local:
        dst_path = store.path(dst)
        os.makedirs(os.path.dirname(dst_path), exist_ok=True)
        try:
            os.link(store.path(src), dst_path)
        except OSError:
            store.put_file(store.path(src), dst)
    else:
        store.fs.copy(store.path(src), store.path(dst))


def _remove_tree(store: Store, path: str) -> None:
    if store.is_local:
        shutil.rmtree(store.path(path), ignore_errors=True)
    elif store.exists(path) or store.isdir(path):
        store.fs.rm(store.path(path), recursive=True)
