"""The decontamination stage: remove (or cut) training text that contains evaluation items.

```python
cfg = job.decontaminate                                      # a typed section of the prepare job, or
cfg = DecontamConfig.from_dict(section, base_dir=job_dir)    # one section on its own (ConfigError naming the key)
result = decontaminate(table, cfg, work_dir)                 # a pa.Table against the job's eval files
result = decontaminate_against_docs(train, validation, cfg)  # against the validation split
```

The eval n-gram index (``pipeline.ngrams``) is built once on the driver and cached in
``work_dir`` under a name derived from its inputs. In ``prepare`` every partition is a Ray task
(``partition_task``) that loads the cached index once per worker process and scans its
documents (a pure function of the text and the index), so the result is the same whatever the
worker count and a rerun after a crash reuses the cached index and gives identical output.
See docs/decontamination.md.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa

from gristmill.manifests import canonical_json, sha256_file, sha256_json

from ... import ngrams
from ...documents import OVERRIDE_SCHEMA, REMOVED_SCHEMA, split_of, to_removed_rows
from ...survivors import Survivors
from ...workdir import WorkDir
from .config import DecontamConfig

SCRATCH = "decontam"  # the work dir's folder of this stage's indexes and validation files

STAGE = "decontaminate"
REASON = "contaminated"
VALIDATION_REASON = "validation_overlap"  # the pass against the dataset's own validation split
# The verdict on a matching document. Removed rows carry the eval_* and matches columns.
ACTION, EVAL_SET, EVAL_ITEM, MATCHES, EVAL_MATCHES, CUT_TEXT = (
    "action", "eval_set", "eval_item", "matches", "eval_matches", "cut_text")
VERDICT = {ACTION: pa.string(), EVAL_SET: pa.string(), EVAL_ITEM: pa.string(), MATCHES: pa.int64(),
           EVAL_MATCHES: pa.string(), CUT_TEXT: pa.string()}  # eval_matches: JSON [[set, item, hits], ...]
BATCH_SIZE = 512
# The report names at most this many matched documents per eval set (every match is counted): the
# manifest, and whatever reads the report, stay bounded by it, not by the contamination found. Every
# removed document is in the run's removed files with its eval item (``gristmill inspect removed``).
LISTED_PER_SET = 1000
# A pass's verdicts, one row per matched document, as each partition task writes them for the report
FOUND_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("position", pa.int64()),
                          (ACTION, pa.string()), (EVAL_MATCHES, pa.string())])


# --------------------------------------------------------------------------------------
# Index: built once, cached in the work dir


def load_eval_sets(cfg: DecontamConfig, max_record_bytes: int | None = None) -> list[tuple[dict, list[tuple[str, str]]]]:
    """Each eval file's record (``manifests.EvalSet`` fields: name, uri, sha256 of its bytes,
    items) and its items, read once, each line (row, paragraph) at most ``max_record_bytes``
    (the job's ``extract.max_record_bytes``). Read before hashed: reading refuses what is not
    a regular file (a FIFO's hash never ends)."""
    out = []
    for spec in cfg.eval_sets:
        items = spec.read_items(max_record_bytes)
        sha, _ = sha256_file(spec.path, store=spec.store())
        out.append(({"name": spec.name, "uri": spec.path, "sha256": sha, "items": len(items)}, items))
    return out


@dataclass
class ScanResult:
    """What the table functions hand back: the documents kept (cut texts applied), the removed
    ones (every column plus ``reason`` and the matched item), and the report's counts."""

    kept: Any  # pa.Table
    removed: Any  # pa.Table
    stats: dict


def eval_index_path(cfg: DecontamConfig, loaded: list[tuple[dict, list]], work_dir: str | WorkDir) -> str:
    """Where the index of these eval files is cached: named by everything it depends on."""
    key = sha256_json({"hash": ngrams.HASH_VERSION, "n": cfg.n, "min_item_words": cfg.min_item_words,
                       "sets": [{**s.content_dict(), "sha256": r["sha256"]} for s, (r, _) in zip(cfg.eval_sets, loaded)]})
    wd = work_dir if isinstance(work_dir, WorkDir) else WorkDir(work_dir)
    return wd.scratch(SCRATCH, "", f"index-{key[:16]}", "npz")


def build_eval_index(cfg: DecontamConfig, loaded: list[tuple[dict, list]], work_dir: str | WorkDir | None) -> ngrams.NgramIndex:
    """The index of the job's eval files, reloaded from ``work_dir`` when the same one was built before."""
    wd = work_dir if isinstance(work_dir, WorkDir) or not work_dir else WorkDir(work_dir)
    path = eval_index_path(cfg, loaded, wd) if wd else None
    if path and wd.exists(path):
        return ngrams.NgramIndex.load(path, wd.store)
    index = ngrams.build_index([(r["name"], items) for r, items in loaded], cfg.n, cfg.min_item_words)
    if path:
        index.save(path, wd.store)
    return index


# --------------------------------------------------------------------------------------
# The stage


def decontaminate(docs: pa.Table, cfg: DecontamConfig, work_dir: str | None) -> ScanResult:
    """Check a table of documents against the job's eval files; see the module docstring."""
    loaded = load_eval_sets(cfg)
    index = build_eval_index(cfg, loaded, work_dir)
    return scan(docs, index, cfg, [record for record, _ in loaded])


def reference_index(items: list[tuple[str, str]], cfg: DecontamConfig, name: str = "validation") -> tuple[ngrams.NgramIndex, dict]:
    """An index whose eval items are reference documents (the validation split), and its record.

    Each reference document is an item (its ``id``), so a removed train document names the
    validation document it overlaps. The record's ``uri`` is ``split:<name>`` and its sha256 is
    that of the sorted ``(id, text)`` pairs. Memory is about 16 bytes per word of reference text.
    """
    items = sorted((str(i), t or "") for i, t in items)
    digest = hashlib.sha256()
    for pair in items:  # the canonical JSON of the sorted pairs, one line each
        digest.update(canonical_json(list(pair)) + b"\n")
    record = {"name": name, "uri": f"split:{name}", "sha256": digest.hexdigest(), "items": len(items)}
    return ngrams.build_index([(name, items)], cfg.n, cfg.min_item_words), record


def decontaminate_against_docs(train_docs: pa.Table, reference_docs: pa.Table, cfg: DecontamConfig,
                               name: str = "validation") -> ScanResult:
    """Check ``train_docs`` against the texts of ``reference_docs`` (the validation split):
    removals are ``validation_overlap``, with ``validation_min_matches``. (The stage also drops
    the corpus' boilerplate grams first, ``validation_max_doc_freq``; this table function sees
    no corpus.)"""
    pairs = zip(reference_docs.column("id").to_pylist(), reference_docs.column("text").to_pylist()) \
        if reference_docs.num_rows else ()
    index, record = reference_index(list(pairs), cfg, name)
    return scan(train_docs, index, cfg, [record], VALIDATION_REASON, cfg.validation_min_matches)


def scan(docs: pa.Table, index: ngrams.NgramIndex, cfg: DecontamConfig, records: list[dict], reason: str = REASON,
         min_matches: int | None = None) -> ScanResult:
    """``docs`` split into kept (cut texts applied) and removed, and the report's counts."""
    found = find(docs, index, cfg, min_matches)
    kept, removed = apply_verdicts(docs, found, reason)
    return ScanResult(kept=kept, removed=removed, stats=report(index, cfg, records, found, min_matches))


def find(docs: pa.Table, index: ngrams.NgramIndex, cfg: DecontamConfig, min_matches: int | None = None) -> list[dict]:
    """The verdict rows of the documents that contain eval items, in (order, id) order."""
    found, k = [], cfg.min_matches if min_matches is None else min_matches
    for start in range(0, docs.num_rows, BATCH_SIZE):
        found += _scan_batch(docs.slice(start, BATCH_SIZE), index, cfg.policy, cfg.margin, k).to_pylist()
    found.sort(key=lambda r: (r["order"], r["id"]))
    return found


def _scan_batch(batch: pa.Table, index: ngrams.NgramIndex, policy: str, margin: int, min_matches: int) -> pa.Table:
    """The documents of ``batch`` that contain eval items: provenance + verdict columns."""
    texts = [t or "" for t in batch.column("text").to_pylist()]
    hit, cols = [], {c: [] for c in VERDICT}
    for row, (text, matches) in enumerate(zip(texts, index.scan(texts, min_matches))):
        if not matches:
            continue
        action, new_text = _decide(text, matches, policy, margin)
        best = max(matches, key=lambda m: m.hits)  # the first item with the most hits
        hit.append(row)
        for c, v in zip(VERDICT, (action, best.eval_set, best.item, best.hits,
                                  json.dumps([[m.eval_set, m.item, m.hits] for m in matches]),
                                  new_text if action == "cut" else None)):
            cols[c].append(v)
    out = batch.select(["id", "order", "source", "position"]).take(pa.array(hit, pa.int64()))
    for c, t in VERDICT.items():
        out = out.append_column(c, pa.array(cols[c], t))
    return out


def apply_verdicts(docs: pa.Table, found: list[dict], reason: str = REASON) -> tuple[pa.Table, pa.Table]:
    """(kept, removed): ``docs`` without the dropped documents and with the cut ones' shorter
    text; the dropped ones with every column plus ``reason`` and the matched item."""
    verdicts = {r["id"]: r for r in found}
    mine = [verdicts.get(i) for i in docs.column("id").to_pylist()]
    drop = [v is not None and v[ACTION] == "drop" for v in mine]
    kept = docs.filter(pa.array([not d for d in drop], pa.bool_()))
    kept_v = [v for v, d in zip(mine, drop) if not d]
    if any(kept_v):
        texts = [t if v is None else v[CUT_TEXT] for t, v in zip(kept.column("text").to_pylist(), kept_v)]
        kept = kept.set_column(kept.schema.get_field_index("text"), "text", pa.array(texts, kept.schema.field("text").type))
    gone = [v for v, d in zip(mine, drop) if d]
    removed = docs.filter(pa.array(drop, pa.bool_()))
    for c in (EVAL_SET, EVAL_ITEM, MATCHES, EVAL_MATCHES):
        removed = removed.append_column(c, pa.array([v[c] for v in gone], VERDICT[c]))
    removed = removed.append_column("reason", pa.array([reason] * len(gone), pa.string()))
    return kept, removed


# -- as tasks over partitions (the executor's stage) -------------------------------------------------
@functools.lru_cache(maxsize=2)
def _load_index(path: str, store) -> ngrams.NgramIndex:
    """The index, read once per worker process (built once on the driver, cached in the work dir)
    through the work dir's store (``work_dir_options``: its credentials may be nowhere else)."""
    return ngrams.NgramIndex.load(path, store)


def partition_task(item: dict, cfg: DecontamConfig, index_path: str, survivors: Survivors, split: Any = None,
                   prefix: str = "") -> dict:
    """One partition's surviving documents against the index at ``index_path``: writes its removed
    rows and its cut texts; returns the verdicts (few) for the report. With ``split``, only the
    partition's train documents are checked (the pass against the validation split: its own
    reason, ``validation_overlap``, and its own ``validation_min_matches``); its files are
    named with ``prefix`` (``val-block-N``)."""
    part, wd = item["part"], survivors.wd
    index = _load_index(index_path, wd.store)
    cols = ["id", "order", "part", "bytes", "source", "position", "text"]
    removed_out = wd.part(wd.removed(STAGE, part, prefix), REMOVED_SCHEMA)
    override_out = wd.part(wd.overrides(STAGE, part, prefix), OVERRIDE_SCHEMA)
    found_out = wd.part(found_path(wd, part, prefix), FOUND_SCHEMA)
    n_found, n_docs, n_bytes, removed_bytes, n_removed = 0, 0, 0, 0, 0
    for t in survivors.docs(part, cols, 4096):
        if split is not None:
            t = t.filter(pa.array([split_of(i, split) == "train" for i in t.column("id").to_pylist()], pa.bool_()))
        n_docs += t.num_rows
        n_bytes += int(sum(t.column("bytes").to_pylist()))
        found = find(t, index, cfg, None if split is None else cfg.validation_min_matches)
        if not found:
            continue
        kept, removed = apply_verdicts(t, found, REASON if split is None else VALIDATION_REASON)
        removed_out.write(to_removed_rows(removed, STAGE))
        n_removed += removed.num_rows
        removed_bytes += int(sum(removed.column("bytes").to_pylist()))
        cut_ids = {r["id"] for r in found if r[ACTION] == "cut"}
        cut = kept.filter(pa.array([i in cut_ids for i in kept.column("id").to_pylist()], pa.bool_()))
        override_out.write(cut.select(OVERRIDE_SCHEMA.names).cast(OVERRIDE_SCHEMA))
        found_out.write(pa.Table.from_pylist(found, FOUND_SCHEMA))
        n_found += len(found)
    removed_out.commit()
    override_out.commit()
    found_out.commit()
    # the verdicts stay in the work dir (report_task reads them): the driver never holds a list that
    # grows with the contamination found
    return {"documents_in": n_docs, "bytes_in": n_bytes, "found": n_found,
            "removed": {REASON if split is None else VALIDATION_REASON: n_removed} if n_removed else {},
            "removed_bytes": removed_bytes}


VALIDATION_SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string())])


def validation_docs_task(item: dict, survivors: Survivors, split: Any) -> dict:
    """One partition's validation documents as they stand after the eval pass (id, text): the
    index task then reads only these, not the corpus."""
    out = survivors.wd.part(survivors.wd.part_scratch(SCRATCH, "validation", item["part"]), VALIDATION_SCHEMA)
    n = 0
    for t in survivors.docs(item["part"], ["id", "text"], 4096):
        t = t.filter(pa.array([split_of(i, split) == "validation" for i in t.column("id").to_pylist()], pa.bool_()))
        out.write(t)
        n += t.num_rows
    out.commit()
    return {"documents": n}


def validation_index_task(item: dict, cfg: DecontamConfig, wd: WorkDir, files: list[str]) -> dict:
    """The index of the validation split's texts (``files``: the block files validation_docs_task
    wrote), saved to the work dir as ``item["out"]``."""
    items = []
    for f in files:
        t = wd.read_parquet(f)
        items += list(zip(t.column("id").to_pylist(), t.column("text").to_pylist()))
    index, record = reference_index(items, cfg)
    index.save(item["out"], wd.store)
    return {"record": record}


DF_SCHEMA = pa.schema([("gram", pa.int64()), ("documents", pa.int64())])


def document_frequency_task(item: dict, index_path: str, survivors: Survivors) -> dict:
    """How many of one partition's documents (both splits, as they stand after the eval pass)
    contain each gram of the validation index: (gram position, documents), for the grams seen."""
    index = _load_index(index_path, survivors.wd.store)
    total: dict[int, int] = {}
    for t in survivors.docs(item["part"], ["id", "text"], 4096):
        grams, counts = index.document_frequency([x or "" for x in t.column("text").to_pylist()])
        for g, c in zip(grams.tolist(), counts.tolist()):
            total[g] = total.get(g, 0) + c
    out = survivors.wd.part(survivors.wd.part_scratch(SCRATCH, "validation_df", item["part"]), DF_SCHEMA)
    keys = sorted(total)
    out.write(pa.table({"gram": keys, "documents": [total[k] for k in keys]}, schema=DF_SCHEMA))
    out.commit()
    return {"grams": len(keys)}


def prune_index_task(item: dict, wd: WorkDir, index_path: str, files: list[str], max_doc_freq: int) -> dict:
    """The validation index without its boilerplate: grams in more than ``max_doc_freq``
    documents of the corpus (summed over the partitions' counts) are dropped, so they never
    count as overlap. Holds one count per validation gram, like the index itself."""
    import numpy as np

    index = _load_index(index_path, wd.store)
    df = np.zeros(index.ngrams, np.int64)
    for f in files:  # the block files document_frequency_task wrote
        t = wd.read_parquet(f)
        np.add.at(df, t.column("gram").to_numpy(), t.column("documents").to_numpy())
    drop = df > max_doc_freq
    index.without(drop).save(item["out"], wd.store)
    return {"boilerplate_ngrams": int(drop.sum()), "max_doc_freq": max_doc_freq}


def found_path(wd: WorkDir, part: int, prefix: str = "") -> str:
    """A pass's verdict rows of one partition (``FOUND_SCHEMA``): ``decontam/found`` for the eval
    pass, ``decontam/val-found`` for the pass against the validation split."""
    return wd.part_scratch(SCRATCH, f"{prefix}found", part)


def report_task(item: dict, cfg: DecontamConfig, wd: WorkDir, index_path: str, records: list[dict],
                files: list[str], min_matches: int | None = None) -> dict:
    """``report`` of one pass, in a worker: its index loaded from the work dir (the validation index
    holds every validation n-gram) and its verdicts read from ``files`` (the block files of
    ``found_path``, in partition order), never held whole: the driver gets a report bounded by
    ``LISTED_PER_SET``."""
    def rows():
        for f in files:
            for batch in wd.iter_batches(f, batch_size=4096):
                yield from batch.to_pylist()
    return {"report": report(_load_index(index_path, wd.store), cfg, records, rows(), min_matches)}


def _decide(text: str, matches: list[ngrams.Match], policy: str, margin: int) -> tuple[str, str | None]:
    """("drop", None) removes the document; ("cut", shorter text) trims it."""
    if policy == "drop":
        return "drop", None
    remaining = cut_text(text, [s for m in matches for s in m.spans], margin)
    if remaining is None or not remaining.strip():  # could not place the cut, or nothing left
        return "drop", None
    return "cut", remaining


def cut_text(text: str, word_spans: list[tuple[int, int]], margin: int) -> str | None:
    """``text`` without the characters of ``word_spans`` (ranges of ``words(text)``) +- ``margin``.

    The pieces left are joined by a newline, so no new n-gram forms across a cut. None when
    word offsets cannot be placed in ``text`` (see ``ngrams.word_char_spans``).
    """
    offsets = ngrams.word_char_spans(text)
    if offsets is None:
        return None
    ranges = sorted((max(0, offsets[a][0] - margin), min(len(text), offsets[b - 1][1] + margin)) for a, b in word_spans)
    pieces, pos = [], 0
    for start, end in ranges:
        if start > pos:
            pieces.append(text[pos:start])
        pos = max(pos, end)
    pieces.append(text[pos:])
    return "\n".join(p.strip() for p in pieces if p.strip())


# -- report ----------------------------------------------------------------------------------
def report(index: ngrams.NgramIndex, cfg: DecontamConfig, records: list[dict], found: Iterable[dict],
           min_matches: int | None = None, limit: int = LISTED_PER_SET) -> dict:
    """Per eval set: items found, removed/cut counts, and the documents the items were found in
    (id, provenance), the first ``limit`` (item, document) matches of the set by name
    (``documents_listed``; every match is counted).

    ``found`` is the scan's verdict rows in corpus order (partition, then (order, id)), read once,
    so the report is deterministic. A document that contains items of two eval sets counts in both.
    """
    per_set, by_item, hit = {}, {}, {}
    for s, name in enumerate(index.set_names):
        first, last = index.set_first[s], index.set_first[s + 1]
        per_set[name] = {"items": int(last - first), "items_indexed": int((index.item_grams[first:last] > 0).sum()),
                         "items_found": 0, "documents_removed": 0, "documents_cut": 0, "matches": 0,
                         "documents_listed": 0, "found": []}
        by_item[name], hit[name] = {item: [] for item in index.items_of(name)}, set()  # file order
    actions = {"removed": 0, "cut": 0}
    for row in found:
        action = "removed" if row[ACTION] == "drop" else "cut"
        actions[action] += 1
        matches = json.loads(row[EVAL_MATCHES])
        for eval_set, item, hits in matches:
            this = per_set[eval_set]
            this["matches"] += 1
            hit[eval_set].add(item)
            if this["documents_listed"] < limit:
                this["documents_listed"] += 1
                by_item[eval_set][item].append({"id": row["id"], "source": row["source"], "position": row["position"],
                                                "hits": hits, "action": action})
        for eval_set in dict.fromkeys(m[0] for m in matches):
            per_set[eval_set][f"documents_{action}"] += 1
    for name, items in by_item.items():
        per_set[name]["found"] = [{"item": item, "documents": docs} for item, docs in items.items() if docs]
        per_set[name]["items_found"] = len(hit[name])
    return {
        "n": cfg.n, "policy": cfg.policy, "margin": cfg.margin if cfg.policy == "cut" else None,
        "min_matches": cfg.min_matches if min_matches is None else min_matches, "ngrams": index.ngrams,
        "documents_removed": actions["removed"], "documents_cut": actions["cut"], "listed_per_set": limit,
        "eval_sets": records, "per_eval_set": per_set,
    }
