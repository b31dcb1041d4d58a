"""`audit doc`: was one document seen, at which steps and ranks, and where did it come from."""
from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from gristmill.manifests import Published

from .checkpoint import AuditError, Checkpoint
from .consumed import Consumed
from .seen import read_spans, row_offsets


def audit_doc(published: Published, ckpt: Checkpoint, used: Consumed, doc_id: str,
              skipped: tuple[Consumed, np.ndarray] | None = None) -> dict:
    """Every consumption of any row holding a span of ``doc_id``, plus its provenance; with ``skipped``
    (audit.consumed.skipped: the skipped samples and their skip records) also every sample of it that
    was skipped, "skipped at step s" (never counted as seen)."""
    m = published.manifest
    # A predicate pushed into the Parquet reader: row groups whose doc_id statistics exclude it are skipped.
    spans = read_spans(published, filters=[("doc_id", "=", doc_id)])
    if spans.num_rows == 0:
        raise AuditError(f"document {doc_id!r} is not in the document index of {m.dataset} "
                         f"(manifest {m.sha256}); it was removed by the pipeline or never part of this dataset")
    spans = spans.sort_by([("shard", "ascending"), ("row", "ascending"), ("start", "ascending")])
    offsets = row_offsets(m)
    doc_keys = offsets[spans.column("shard").to_numpy()] + spans.column("row").to_numpy()
    keys = offsets[used.shard] + used.row
    hit = np.isin(keys, doc_keys)
    span_of_key = {int(k): i for i, k in enumerate(doc_keys)}
    lengths = spans.column("length").to_pylist()
    occurrences = [
        {"step": int(used.step[i]), "rank": int(used.rank[i]), "index": int(used.index[i]),
         "shard": m.shards[used.shard[i]].path, "row": int(used.row[i]), "tokens": lengths[span_of_key[int(keys[i])]]}
        for i in np.flatnonzero(hit)
    ]
    passed_over = []
    if skipped is not None:
        sk, which = skipped
        sk_keys = offsets[sk.shard] + sk.row
        for i in np.flatnonzero(np.isin(sk_keys, doc_keys)):
            rec = ckpt.skips[int(which[i])]
            passed_over.append({"step": int(sk.step[i]), "skipped_at_step": int(rec["step"]), "kind": rec["kind"],
                                "reason": rec["reason"], "index": int(sk.index[i]), "shard": m.shards[sk.shard[i]].path,
                                "row": int(sk.row[i]), "tokens": lengths[span_of_key[int(sk_keys[i])]]})
    first = spans.slice(0, 1).to_pylist()[0]
    inputs = {i.uri: i for i in m.inputs}
    source = inputs.get(first["source"])
    total = int(pc.sum(spans.column("length")).as_py())
    tokens_seen = int(np.asarray(lengths, dtype=np.int64)[np.isin(doc_keys, keys[hit])].sum())
    return {
        "doc_id": doc_id,
        "seen": bool(occurrences),
        "fully_seen": tokens_seen == total,
        "tokens": total,
        "tokens_seen": tokens_seen,
        "steps": sorted({o["step"] for o in occurrences}),
        "ranks": sorted({o["rank"] for o in occurrences}),
        "occurrences": occurrences,
        "skipped": passed_over,
        "provenance": {
            "source": first["source"], "position": first["position"], "lang": first["lang"], "url": first.get("url"),
            "input_sha256": source.sha256 if source else None, "input_bytes": source.bytes if source else None,
            "dataset": m.dataset, "version": m.version, "manifest_sha256": m.sha256, "manifest_url": published.url,
            "spans": [{"shard": m.shards[s].path, "row": r, "start": st, "length": l}
                      for s, r, st, l in zip(spans.column("shard").to_pylist(), spans.column("row").to_pylist(),
                                             spans.column("start").to_pylist(), lengths)],
        },
        "checkpoint": {"path": ckpt.path, "step": ckpt.step, "world_size": ckpt.world_size,
                       "global_batch": ckpt.global_batch, "seed": ckpt.seed, "order": ckpt.order},
    }
