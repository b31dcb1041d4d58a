"""The decontamination stage: remove (or cut) training text that contains evaluation items.

```python
cfg = job.decontaminate                                      # a typed section of the prepare job, or
cfg = DecontamConfig.from_dict(section, base_dir=job_dir)    # one section on its own (ConfigError naming the key)
result = decontaminate(docs, cfg, work_dir)                  # against the job's eval files
result = decontaminate_against_docs(train, validation, cfg)  # against the validation split
```

The eval n-gram index (``pipeline.ngrams``) is built once on the driver, cached in
``work_dir`` under a name derived from its inputs, and shared with every Ray worker through
one ``ray.put``. Workers scan batches of documents (a pure function of the text and the
index), so the result is the same whatever the worker count and a rerun after a crash
reuses the cached index and gives identical output. See docs/decontamination.md.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pyarrow as pa

from gristmill.manifests import canonical_json, sha256_file, sha256_json
from gristmill.pipeline import ngrams
from gristmill.pipeline.stage import StageResult
# The stage's config is a section of the one prepare-job model; importable from here as before.
from gristmill.pipeline.config import DecontamConfig, EvalSetSpec  # noqa: F401

REASON = "contaminated"
# The verdict on a matching document. Removed rows carry the eval_* and matches columns.
ACTION, EVAL_SET, EVAL_ITEM, MATCHES, EVAL_MATCHES, CUT_TEXT = (
    "action", "eval_set", "eval_item", "matches", "eval_matches", "cut_text")
VERDICT = {ACTION: pa.string(), EVAL_SET: pa.string(), EVAL_ITEM: pa.string(), MATCHES: pa.int64(),
           EVAL_MATCHES: pa.string(), CUT_TEXT: pa.string()}  # eval_matches: JSON [[set, item, hits], ...]
BATCH_SIZE = 512


# --------------------------------------------------------------------------------------
# Index: built once, cached in the work dir


def load_eval_sets(cfg: DecontamConfig) -> list[tuple[dict, list[tuple[str, str]]]]:
    """Each eval file's record (``manifests.EvalSet`` fields: name, uri, sha256 of its bytes,
    items) and its items, read once."""
    out = []
    for spec in cfg.eval_sets:
        sha, _ = sha256_file(spec.path)
        items = spec.read_items()
        out.append(({"name": spec.name, "uri": spec.path, "sha256": sha, "items": len(items)}, items))
    return out


def build_eval_index(cfg: DecontamConfig, loaded: list[tuple[dict, list]], work_dir: str | None) -> ngrams.NgramIndex:
    """The index of the job's eval files, reloaded from ``work_dir`` when the same one was built before."""
    key = sha256_json({"hash": ngrams.HASH_VERSION, "n": cfg.n, "min_item_words": cfg.min_item_words,
                       "sets": [{**s.to_dict(), "sha256": r["sha256"]} for s, (r, _) in zip(cfg.eval_sets, loaded)]})
    path = os.path.join(work_dir, "decontam", f"index-{key[:16]}.npz") if work_dir else None
    if path and os.path.exists(path):
        return ngrams.NgramIndex.load(path)
    index = ngrams.build_index([(r["name"], items) for r, items in loaded], cfg.n, cfg.min_item_words)
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        index.save(path)
    return index


# --------------------------------------------------------------------------------------
# The stage


def decontaminate(docs, cfg: DecontamConfig, work_dir: str | None) -> StageResult:
    """Check ``docs`` against the job's eval files; see the module docstring."""
    loaded = load_eval_sets(cfg)
    index = build_eval_index(cfg, loaded, work_dir)
    return scan(docs, index, cfg, [record for record, _ in loaded])


def decontaminate_against_docs(train_docs, reference_docs, cfg: DecontamConfig, work_dir: str | None = None,
                               name: str = "validation") -> StageResult:
    """Check ``train_docs`` against the texts of ``reference_docs`` (the validation split).

    Each reference document is an eval item (its ``id``), so a removed train document names
    the validation document it overlaps. Its ``eval_sets`` entry has ``uri`` ``split:<name>``
    and the sha256 of the sorted ``(id, text)`` pairs. The reference texts are indexed on the
    driver: memory is about 16 bytes per word of validation text.
    """
    items = sorted((str(i), t or "") for batch in reference_docs.select_columns(["id", "text"]).iter_batches(
        batch_format="pyarrow") for i, t in zip(batch.column("id").to_pylist(), batch.column("text").to_pylist()))
    digest = hashlib.sha256()
    for pair in items:  # the canonical JSON of the sorted pairs, one line each
        digest.update(canonical_json(list(pair)) + b"\n")
    record = {"name": name, "uri": f"split:{name}", "sha256": digest.hexdigest(), "items": len(items)}
    index = ngrams.build_index([(name, items)], cfg.n, cfg.min_item_words)
    return scan(train_docs, index, cfg, [record])


def scan(docs, index: ngrams.NgramIndex, cfg: DecontamConfig, records: list[dict]) -> StageResult:
    """Scan ``docs`` against ``index`` on the Ray workers; split into kept and removed; count.

    The scan returns only the documents that matched (few), with their verdicts; ``kept`` and
    ``removed`` then apply those verdicts to ``docs`` lazily, so the corpus is never held in
    memory and is scanned once.
    """
    import ray

    ref = ray.put(index)  # one copy in the object store, shared by every worker on the node
    found = docs.map_batches(
        _scan_batch, batch_format="pyarrow", batch_size=BATCH_SIZE, zero_copy_batch=True,
        fn_kwargs={"index_ref": [ref], "policy": cfg.policy, "margin": cfg.margin, "min_matches": cfg.min_matches},
    ).take_all()
    found.sort(key=lambda r: (r["order"], r["id"]))
    verdicts = ray.put({r["id"]: r for r in found})
    kept = docs.map_batches(_kept_rows, batch_format="pyarrow", zero_copy_batch=True, fn_kwargs={"verdicts_ref": [verdicts]})
    removed = docs.map_batches(_removed_rows, batch_format="pyarrow", zero_copy_batch=True,
                               fn_kwargs={"verdicts_ref": [verdicts]})
    return StageResult(kept=kept, removed=removed, stats=report(index, cfg, records, found))


# -- worker side -----------------------------------------------------------------------------
_cache: dict[str, Any] = {}


def _resolve(ref_list) -> Any:
    """An object shared by ``ray.put``, fetched once per worker process (the index, the verdicts)."""
    import ray

    ref = ref_list[0]  # wrapped in a list so Ray passes the ref itself, not its value
    key = ref.hex()
    if key not in _cache:
        if len(_cache) >= 4:  # only the current job's objects are worth keeping
            _cache.clear()
        _cache[key] = ray.get(ref)
    return _cache[key]


def _scan_batch(batch: pa.Table, index_ref, policy: str, margin: int, min_matches: int) -> pa.Table:
    """The documents of ``batch`` that contain eval items: provenance + verdict columns."""
    index = _resolve(index_ref)
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


def _kept_rows(batch: pa.Table, verdicts_ref) -> pa.Table:
    """``batch`` without the dropped documents, with the cut ones' shorter text."""
    verdicts = _resolve(verdicts_ref)
    mine = [verdicts.get(i) for i in batch.column("id").to_pylist()]
    if not any(mine):
        return batch
    batch = batch.filter(pa.array([v is None or v[ACTION] != "drop" for v in mine], pa.bool_()))
    mine = [v for v in mine if v is None or v[ACTION] != "drop"]
    texts = [t if v is None else v[CUT_TEXT] for t, v in zip(batch.column("text").to_pylist(), mine)]
    return batch.set_column(batch.schema.get_field_index("text"), "text", pa.array(texts, batch.schema.field("text").type))


def _removed_rows(batch: pa.Table, verdicts_ref) -> pa.Table:
    """The dropped documents of ``batch``, every column, plus ``reason`` and the matched item."""
    verdicts = _resolve(verdicts_ref)
    gone = [(row, v) for row, i in enumerate(batch.column("id").to_pylist())
            if (v := verdicts.get(i)) is not None and v[ACTION] == "drop"]
    out = batch.take(pa.array([row for row, _ in gone], pa.int64()))
    for c in (EVAL_SET, EVAL_ITEM, MATCHES, EVAL_MATCHES):
        out = out.append_column(c, pa.array([v[c] for _, v in gone], VERDICT[c]))
    return out.append_column("reason", pa.array([REASON] * len(gone), pa.string()))


# -- report ----------------------------------------------------------------------------------
def report(index: ngrams.NgramIndex, cfg: DecontamConfig, records: list[dict], found: list[dict]) -> dict:
    """Per eval set: items found, the documents they were found in (id, provenance), removed/cut counts.

    ``found`` is the scan's verdict rows in (order, id) order, so the report is deterministic.
    A document that contains items of two eval sets counts in both.
    """
    per_set, by_item = {}, {}
    for s, name in enumerate(index.set_names):
        first, last = index.set_first[s], index.set_first[s + 1]
        per_set[name] = {"items": int(last - first), "items_indexed": int((index.item_grams[first:last] > 0).sum()),
                         "items_found": 0, "documents_removed": 0, "documents_cut": 0, "found": []}
        by_item[name] = {item: [] for item in index.items_of(name)}  # file order
    for row in found:
        action = "removed" if row[ACTION] == "drop" else "cut"
        matches = json.loads(row[EVAL_MATCHES])
        for eval_set, item, hits in matches:
            by_item[eval_set][item].append({"id": row["id"], "source": row["source"], "position": row["position"],
                                            "hits": hits, "action": action})
        for eval_set in dict.fromkeys(m[0] for m in matches):
            per_set[eval_set][f"documents_{action}"] += 1
    for name, items in by_item.items():
        per_set[name]["found"] = [{"item": item, "documents": docs} for item, docs in items.items() if docs]
        per_set[name]["items_found"] = len(per_set[name]["found"])
    actions = [r[ACTION] for r in found]
    return {
        "n": cfg.n, "policy": cfg.policy, "margin": cfg.margin if cfg.policy == "cut" else None,
        "min_matches": cfg.min_matches, "ngrams": index.ngrams,
        "documents_removed": actions.count("drop"), "documents_cut": actions.count("cut"),
        "eval_sets": records, "per_eval_set": per_set,
    }
