"""Dedup against published versions: the steps of the ``dedup_against`` stage, as tasks over files.

A new document is compared with an earlier one when they share a **join key**: the 8-byte exact
key, or one band of the sketch (``dedup_index.doc_keys``). The work is a hash join bucketed by
join key, the shape of fuzzy dedup's own steps, so its cost grows with the new data plus one
read of the earlier index, never with new partitions x index:

1. ``keys`` (a task per new partition and a task per earlier index file, in one step): a
   partition's surviving documents get their sketches and join-key rows ``(bucket, band, key,
   ref)`` (``ref``: the document's ``order``), written sorted by bucket, and their sketches kept
   (``new/part-N``); an index file is read from its store, checked against the manifest entry
   that pins it (sha256, bytes, rows, schema, MinHash parameters: a corrupted or forged file is
   refused like a forged shard) and kept in the work dir, and its documents' join-key rows
   (``ref``: the file's number << 32 | the row) written the same way;
2. ``candidates`` (a task per bucket range, as many as the join-key rows need): the range's rows
   of every new partition and, only where there are new rows, of every index file; every new
   document with every earlier one sharing a (band, key): the distinct candidate pairs, flagged
   exact (equal exact key) or near (a shared band), written sorted by index file;
3. ``fetch`` (a task per index file with a candidate): that file's candidate pairs from every
   candidates task, and of its rows only the row groups holding them (id and sketch), written
   sorted by the new document's partition;
4. ``match`` (a task per new partition): its pairs from every fetch file, beside its own kept
   sketches; ``dedup_index.resolve`` gives each document's verdict (the same function the
   in-memory ``dedup_index.match`` uses); ``removed/dedup_against/block-B`` names the earlier
   version and document.

Task lists come from the data (partitions, index files, bucket ranges), so the result does not
depend on the worker count or the bucket ranges, and each task's marker lets a rerun skip it.
"""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from gristmill.manifests import dedup_index as dx

from ...lsh import plan_bucket_ranges
from ... import dedup_index as di
from ...documents import PART_SHIFT, REMOVED_SCHEMA, to_removed_rows
from ...runner import Runner
from ...stats import Counts
from ...survivors import Survivors
from ...workdir import WorkDir, part_name

STAGE = "dedup_against"
REASONS = {"exact": "earlier_exact_duplicate", "near": "earlier_near_duplicate"}
FILE_SHIFT = 32  # an earlier document's ref: its index file's number << 32 | its row in the file
_ROW_GROUP = 65_536

KEY_SCHEMA = pa.schema([("bucket", pa.int32()), ("band", pa.int32()), ("key", pa.uint64()), ("ref", pa.int64())])
PAIR_SCHEMA = pa.schema([("file", pa.int32()), ("ref", pa.int64()), ("order", pa.int64()), ("exact", pa.bool_()),
                         ("near", pa.bool_())])


def _new_schema(params: dict) -> pa.Schema:
    return pa.schema([("order", pa.int64()), ("id", pa.string()), ("bytes", pa.int64()), ("has_words", pa.bool_()),
                      ("sketch", pa.binary(dx.sketch_bytes(params)))])


def _fetched_schema(params: dict) -> pa.Schema:
    return pa.schema([("part", pa.int32()), ("order", pa.int64()), ("ref", pa.int64()), ("exact", pa.bool_()),
                      ("near", pa.bool_()), ("doc_id", pa.string()), ("has_words", pa.bool_()),
                      ("sketch", pa.binary(dx.sketch_bytes(params)))])


def _fixed(m: np.ndarray, width: int) -> pa.Array:
    m = np.ascontiguousarray(np.asarray(m, np.uint8).reshape(len(m), width))
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(m), [None, pa.py_buffer(m.tobytes())])


def _key_table(band, key, ref) -> pa.Table:
    t = pa.table({"bucket": di.key_bucket(band, key), "band": band, "key": key, "ref": ref}, schema=KEY_SCHEMA)
    return t.sort_by([("bucket", "ascending"), ("band", "ascending"), ("key", "ascending"), ("ref", "ascending")])


# -- 1. keys -------------------------------------------------------------------------------------
def keys_task(item: dict, wd: WorkDir, survivors: Survivors, params: dict, batch_size: int) -> dict:
    """A new partition's join keys and sketches (``item["part"]``), or an earlier index file's
    (``item["file"]``): see the module's step 1."""
    if "part" in item:
        return _new_keys(item, wd, survivors, params, batch_size)
    return _index_keys(item, wd, params)


def _new_keys(item: dict, wd: WorkDir, survivors: Survivors, params: dict, batch_size: int) -> dict:
    width = dx.sketch_bytes(params)
    keys, new, docs, nbytes = [], [], 0, 0
    for t in survivors.docs(item["part"], ["id", "order", "text", "norm_hash", "bytes"], batch_size):
        docs += t.num_rows
        nbytes += int(sum(t.column("bytes").to_pylist()))
        sk, has = di.sketch_texts(t.column("text").to_pylist(), params)
        order = t.column("order").to_numpy()
        band, key, doc = di.doc_keys(di.exact_u64(dx.exact_keys(t.column("norm_hash").to_pylist())), sk, has, params)
        keys.append((band, key, order[doc]))
        new.append(pa.table({"order": order, "id": t.column("id"), "bytes": t.column("bytes"),
                             "has_words": pa.array(has, pa.bool_()), "sketch": _fixed(sk, width)}, schema=_new_schema(params)))
    kt = _key_table(*(np.concatenate(c) for c in zip(*keys))) if keys else KEY_SCHEMA.empty_table()
    out = wd.part(wd.scratch(STAGE, "keys", item["name"]), KEY_SCHEMA, row_group_size=_ROW_GROUP)
    out.write(kt)
    out.commit()
    out = wd.part(wd.scratch(STAGE, "new", item["name"]), _new_schema(params), row_group_size=_ROW_GROUP)
    out.write(pa.concat_tables(new) if new else _new_schema(params).empty_table())
    out.commit()
    return {"documents_in": docs, "bytes_in": nbytes, "key_rows": kt.num_rows}


def _index_keys(item: dict, wd: WorkDir, params: dict) -> dict:
    from gristmill.manifests import FileRef

    ref = FileRef(item["path"], item["sha256"], item["bytes"], item["rows"])
    t = di.load_index_file(item["url"], ref, params, item["label"], wd.scratch(STAGE, "index", item["name"]), out_store=wd.store)
    isk, ihas = dx.sketch_matrix(t.column("sketch"), dx.sketch_bytes(params)) if t.num_rows else \
        (np.zeros((0, dx.sketch_bytes(params)), np.uint8), np.zeros(0, bool))
    band, key, row = di.doc_keys(di.exact_u64(t.column("exact")), isk, ihas, params)
    kt = _key_table(band, key, (np.int64(item["file"]) << np.int64(FILE_SHIFT)) | row)
    out = wd.part(wd.scratch(STAGE, "keys", item["name"]), KEY_SCHEMA, row_group_size=_ROW_GROUP)
    out.write(kt)
    out.commit()
    return {"index_rows": t.num_rows, "key_rows": kt.num_rows}


# -- 2. candidates -------------------------------------------------------------------------------
def candidates_task(item: dict, wd: WorkDir, new: list[str], old: list[str], exact_band: int) -> dict:
    """One bucket range: its join-key rows of every new partition (``new``: their task names) and,
    if there are any, of every index file (``old``); the candidate pairs, sorted by index file."""
    flt = [("bucket", ">=", item["lo"]), ("bucket", "<", item["hi"])]
    cols = ["band", "key", "ref"]
    n = pa.concat_tables([wd.read_parquet(wd.scratch(STAGE, "keys", x), cols, flt) for x in new]) if new else \
        KEY_SCHEMA.empty_table().select(cols)
    o = pa.concat_tables([wd.read_parquet(wd.scratch(STAGE, "keys", x), cols, flt) for x in old]) if old and n.num_rows else \
        KEY_SCHEMA.empty_table().select(cols)  # no new rows in the range: nothing of the index to read
    i, j, ex, nr = di.join_keys(tuple(n.column(c).to_numpy() for c in cols), tuple(o.column(c).to_numpy() for c in cols),
                                exact_band)
    idx = np.lexsort((i, j))
    out = wd.part(wd.scratch(STAGE, "candidates", item["name"]), PAIR_SCHEMA, row_group_size=_ROW_GROUP)
    out.write(pa.table({"file": (j[idx] >> FILE_SHIFT).astype(np.int32), "ref": j[idx], "order": i[idx],
                        "exact": ex[idx], "near": nr[idx]}, schema=PAIR_SCHEMA))
    out.commit()
    return {"new_key_rows": n.num_rows, "index_key_rows": o.num_rows, "pairs": len(i),
            "files": sorted(set((j >> FILE_SHIFT).tolist()))}


# -- 3. fetch ------------------------------------------------------------------------------------
def fetch_task(item: dict, wd: WorkDir, params: dict, candidates: list[str]) -> dict:
    """Index file ``item["file"]``: its candidate pairs of every candidates task, with the earlier
    documents' ids and sketches read from just the row groups that hold them; sorted by the new
    document's partition."""
    t = pa.concat_tables([wd.read_parquet(wd.scratch(STAGE, "candidates", c), ["ref", "order", "exact", "near"],
                                [("file", "=", item["file"])]) for c in candidates])
    i, j, ex, nr = di.dedupe_pairs(t.column("order").to_numpy(), t.column("ref").to_numpy(),
                                   dx.bool_values(t.column("exact")), dx.bool_values(t.column("near")))
    rows = j & ((1 << FILE_SHIFT) - 1)
    with wd.open_parquet(wd.scratch(STAGE, "index", item["name"])) as pf:
        sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        groups = np.unique(np.searchsorted(starts, rows, "right") - 1).tolist()
        g = pf.read_row_groups(groups, columns=["doc_id", "sketch"], use_threads=False) if groups else None
    width = dx.sketch_bytes(params)
    if g is not None:
        # position of a file row among the rows of the row groups read
        offset = np.concatenate([[0], np.cumsum([sizes[k] for k in groups])]).astype(np.int64)
        gi = np.searchsorted(np.asarray(groups), np.searchsorted(starts, rows, "right") - 1)
        pos = offset[gi] + rows - starts[np.asarray(groups)[gi]]
        sk, has = dx.sketch_matrix(g.column("sketch"), width)
        ids = g.column("doc_id").take(pa.array(pos))
        sk, has = sk[pos], has[pos]
    else:
        ids, sk, has = pa.array([], pa.string()), np.zeros((0, width), np.uint8), np.zeros(0, bool)
    part = (i >> PART_SHIFT).astype(np.int32)
    idx = np.lexsort((j, i, part))
    out = wd.part(wd.scratch(STAGE, "fetched", item["name"]), _fetched_schema(params), row_group_size=_ROW_GROUP)
    out.write(pa.table({"part": part[idx], "order": i[idx], "ref": j[idx], "exact": ex[idx], "near": nr[idx],
                        "doc_id": ids.take(pa.array(idx)), "has_words": pa.array(has[idx], pa.bool_()),
                        "sketch": _fixed(sk[idx], width)}, schema=_fetched_schema(params)))
    out.commit()
    return {"pairs": len(i), "row_groups_read": len(groups), "row_groups": len(sizes)}


# -- 4. match ------------------------------------------------------------------------------------
def match_task(item: dict, wd: WorkDir, params: dict, threshold: float, sources: list[dict], fetched: list[str]) -> dict:
    """Partition ``item["part"]``'s verdicts from its candidate pairs (every fetch file's rows of
    the partition) and its kept sketches: its rows of ``removed/dedup_against/block-B``. ``sources``: per index
    file number, ``{"version", "url", "sha256"}`` of its version."""
    width = dx.sketch_bytes(params)
    cols = ["order", "ref", "exact", "near", "doc_id", "has_words", "sketch"]
    t = pa.concat_tables([wd.read_parquet(wd.scratch(STAGE, "fetched", f), cols, [("part", "=", item["part"])]) for f in fetched]) \
        if fetched else _fetched_schema(params).empty_table().select(cols)
    new = wd.read_parquet(wd.scratch(STAGE, "new", item["name"]), ["order", "id", "bytes", "has_words", "sketch"])
    orders = new.column("order").to_numpy()
    nsk, _ = dx.sketch_matrix(new.column("sketch"), width) if new.num_rows else (np.zeros((0, width), np.uint8), None)
    nhas = dx.bool_values(new.column("has_words"))
    osk, _ = dx.sketch_matrix(t.column("sketch"), width) if t.num_rows else (np.zeros((0, width), np.uint8), None)
    i = np.searchsorted(orders, t.column("order").to_numpy()) if t.num_rows else np.zeros(0, np.int64)
    j = t.column("ref").to_numpy() if t.num_rows else np.zeros(0, np.int64)
    v = di.resolve(params, threshold, new.num_rows, i, j, dx.bool_values(t.column("exact")),
                   dx.bool_values(t.column("near")), nsk, nhas, osk, dx.bool_values(t.column("has_words")))
    hit = np.flatnonzero(v["pair"] >= 0)
    ids, nbytes = new.column("id").to_pylist(), new.column("bytes").to_pylist()
    old_ids = t.column("doc_id").to_pylist()
    rows = {k: [] for k in ("id", "order", "bytes", "reason", "duplicate_of", "earlier_version", "earlier_url",
                            "earlier_sha256", "similarity")}
    for d in hit.tolist():
        k = int(v["pair"][d])
        src = sources[int(j[k]) >> FILE_SHIFT]
        rows["id"].append(ids[d])
        rows["order"].append(int(orders[d]))
        rows["bytes"].append(nbytes[d])
        rows["reason"].append(REASONS[v["kind"][d]])
        rows["duplicate_of"].append(old_ids[k])
        rows["earlier_version"].append(src["version"])
        rows["earlier_url"].append(src["url"])
        rows["earlier_sha256"].append(src["sha256"])
        rows["similarity"].append(round(float(v["similarity"][d]), 6))
    out = wd.part(wd.removed(STAGE, item["part"]), REMOVED_SCHEMA)
    out.write(to_removed_rows(pa.table(rows), STAGE) if rows["id"] else REMOVED_SCHEMA.empty_table())
    out.commit()
    by_reason: dict[str, int] = {}
    for r in rows["reason"]:
        by_reason[r] = by_reason.get(r, 0) + 1
    return {"removed": by_reason, "removed_bytes": int(sum(rows["bytes"])), "pairs": t.num_rows}


# -- the steps in order --------------------------------------------------------------------------
def dedup_against(runner: Runner, survivors: Survivors, parts: list[int], params: dict, threshold: float,
                  files: list[dict], batch_size: int) -> tuple[Counts, dict]:
    """Every step over partitions ``parts``' surviving documents and the earlier index ``files``
    (in index order; each ``{"url", "path", "sha256", "bytes", "rows", "label", "version",
    "version_url", "version_sha256"}``); writes ``removed/dedup_against/block-B`` and returns the
    counts and the stage's detail."""
    wd = survivors.wd
    per_part = [{"name": part_name(p), "part": p} for p in parts]
    per_file = [{"name": f"file-{k:05d}", "file": k, **{c: f[c] for c in ("url", "path", "sha256", "bytes", "rows", "label")}}
                for k, f in enumerate(files)]
    keys = runner.run(f"{STAGE}.keys", per_part + per_file, functools.partial(
        keys_task, wd=wd, survivors=survivors, params=params, batch_size=batch_size))
    ranges = plan_bucket_ranges(sum(s["key_rows"] for s in keys))
    cand_items = [{"name": f"task-{i:03d}", "lo": lo, "hi": hi} for i, (lo, hi) in enumerate(ranges)]
    cand = runner.run(f"{STAGE}.candidates", cand_items, functools.partial(
        candidates_task, wd=wd, new=[it["name"] for it in per_part], old=[it["name"] for it in per_file],
        exact_band=params["bands"]))
    hit = sorted({k for s in cand for k in s["files"]})
    fetch_items = [per_file[k] for k in hit]
    fetch = runner.run(f"{STAGE}.fetch", [{"name": it["name"], "file": it["file"]} for it in fetch_items],
                       functools.partial(fetch_task, wd=wd, params=params, candidates=[it["name"] for it in cand_items]))
    sources = [{"version": f["version"], "url": f["version_url"], "sha256": f["version_sha256"]} for f in files]
    done = runner.run(f"{STAGE}.match", per_part, functools.partial(
        match_task, wd=wd, params=params, threshold=threshold, sources=sources, fetched=[it["name"] for it in fetch_items]))
    flow = Counts.of_tasks(keys) + Counts.of_tasks(done)
    detail = {"index_rows": sum(s.get("index_rows", 0) for s in keys), "index_files": len(files),
              "candidate_pairs": sum(s["pairs"] for s in fetch), "threshold": threshold,
              "documents_removed": sum(flow.removed.values())}
    return flow, detail
