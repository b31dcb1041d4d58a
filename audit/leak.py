"""`audit leak`: did any item of an eval set occur in the text a checkpoint's model saw.

The method is decontamination's, imported from `pipeline.ngrams` (normalised word n-grams,
default n = 13, a short item matches whole): "contains eval item X" means the same thing here
as in the pipeline. The text checked is what the model saw: the consumed spans of each
document, read from the pinned shards and detokenized (see audit/tokens.py for why).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.manifests import Published, sha256_file

from .consumed import Consumed
from .seen import read_spans, row_offsets, row_use, seen_spans
from .tokens import ShardReader, load_tokenizer, seen_pieces

MATCH_SCHEMA = pa.schema([
    ("eval_set", pa.string()), ("item", pa.string()), ("doc_id", pa.string()), ("ngrams", pa.int64()),
    ("steps", pa.list_(pa.int64())), ("source", pa.string()), ("position", pa.int64()),
])


@dataclass(frozen=True)
class LeakReport:
    summary: dict
    matches: pa.Table  # one row per (eval item, document piece) match, MATCH_SCHEMA


def load_index(eval_file: str, *, n: int | None = None, fields=None, id_field: str | None = None, fmt: str | None = None):
    from gristmill.pipeline.ngrams import DEFAULT_N, index_from_file

    name = os.path.basename(eval_file)
    try:
        return index_from_file(eval_file, name, n=n or DEFAULT_N, fmt=fmt, fields=tuple(fields or ("text",)),
                               id_field=id_field)
    except ValueError as e:  # the n-gram module names file, line and field; make it a one-line user error
        from .checkpoint import AuditError

        raise AuditError(str(e)) from e


def dataset_settings(published: Published) -> dict:
    """n and min_matches the dataset was decontaminated with (its job config), so both checks agree."""
    section = published.manifest.config.get("decontaminate") if isinstance(published.manifest.config, dict) else None
    section = section if isinstance(section, dict) else {}
    return {k: int(section[k]) for k in ("n", "min_matches") if isinstance(section.get(k), int)}


def audit_leak(published: Published, used: Consumed, eval_file: str, *, fields=None, n: int | None = None,
               min_matches: int | None = None, id_field: str | None = None, fmt: str | None = None) -> LeakReport:
    """``n``/``min_matches`` default to the dataset's decontamination settings, else 13 and 1."""
    m = published.manifest
    settings = dataset_settings(published)
    n = n or settings.get("n")
    min_matches = min_matches or settings.get("min_matches", 1)
    index = load_index(eval_file, n=n, fields=fields, id_field=id_field, fmt=fmt)
    spans = seen_spans(m, read_spans(published), row_use(m, used))
    seen_docs = pc.unique(spans.filter(pc.greater(spans.column("tokens_seen"), 0)).column("doc_id"))
    spans = spans.filter(pc.is_in(spans.column("doc_id"), value_set=seen_docs))
    # Each document's spans together, in index order (shard, row, start): a stable sort of integer codes.
    codes = pc.dictionary_encode(spans.column("doc_id")).combine_chunks().indices.to_numpy()
    spans = spans.take(np.argsort(codes, kind="stable"))
    offsets = row_offsets(m)
    consumed_keys = offsets[used.shard] + used.row

    rows, tokens_checked = [], 0
    for pieces in seen_pieces(m, spans, offsets, ShardReader(published), load_tokenizer(published)):
        tokens_checked += sum(p.tokens for p in pieces)
        for piece, matches in zip(pieces, index.scan([p.text for p in pieces], min_matches)):
            if not matches:
                continue
            steps = np.unique(used.step[np.isin(consumed_keys, piece.keys)]).tolist()
            source, position = (spans.column(c)[piece.first_span].as_py() for c in ("source", "position"))
            rows += [{"eval_set": x.eval_set, "item": x.item, "doc_id": piece.doc_id, "ngrams": x.hits, "steps": steps,
                      "source": source, "position": position} for x in matches]
    file_order = {item: i for i, item in enumerate(index.item_ids)}
    rows.sort(key=lambda r: (file_order[r["item"]], r["doc_id"], r["steps"]))
    matches = pa.Table.from_pylist(rows, schema=MATCH_SCHEMA)
    eval_sha, _ = sha256_file(eval_file)
    listed = [e.name for e in m.eval_sets if e.sha256 == eval_sha]
    all_steps = sorted({s for r in rows for s in r["steps"]})
    items = list(dict.fromkeys(r["item"] for r in rows))  # in eval-file order
    summary = {
        "eval_file": eval_file, "eval_sha256": eval_sha, "n": index.n, "min_matches": min_matches,
        "decontaminated_against": listed[0] if listed else None,  # this exact file is in the manifest's eval_sets
        "items": len(index.item_ids), "items_leaked": len(items), "leaked_items": items,
        "documents_checked": len(seen_docs), "tokens_checked": tokens_checked,
        "documents_leaked": len({r["doc_id"] for r in rows}), "steps": all_steps,
        "manifest_sha256": m.sha256,
    }
    return LeakReport(summary, matches)
