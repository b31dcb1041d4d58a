"""One partition of the quality stage: measure every surviving document, remove those a rule
fails, keep every document's metrics.

Outputs (each written atomically; the task's marker commits them):

* its rows of ``quality/block-B.parquet`` (``WorkDir.part_scratch``): ``id``, ``order``, ``part``, ``reason`` (null: kept) and one
  float column per metric (named like its rule, e.g. ``gopher_quality:word_count``; null where
  the document's input turned that rule set off), for every document the stage saw;
* ``removed/quality/block-B.parquet``: the removed documents, ``reason`` = the rule, ``detail``
  = ``{"value": ..., "threshold": ...}``;
* ``overrides/quality/block-B.parquet``: the new text of kept documents C4 dropped lines from.

A document's verdict is a function of its text and its input's settings only, so the output
is the same whatever the number of workers.
"""
from __future__ import annotations

import pyarrow as pa

from ...documents import OVERRIDE_SCHEMA, REMOVED_SCHEMA, to_removed_rows
from ...quality import evaluate, rule_sets
from ...survivors import Survivors
from .config import QualityConfig

STAGE = "quality"

COLUMNS = ["id", "order", "part", "bytes", "source", "text"]


def metrics_schema(names: list[str]) -> pa.Schema:
    return pa.schema([("id", pa.string()), ("order", pa.int64()), ("part", pa.int32()), ("reason", pa.string()),
                      *((n, pa.float64()) for n in names)])


def partition_task(item: dict, configs: list[dict], names: list[str], survivors: Survivors) -> dict:
    """``item``: name, part, sources (uri -> input index)."""
    cfgs = [QualityConfig.model_validate(c) for c in configs]
    sets = [rule_sets(c) for c in cfgs]  # once per task, not per document
    schema = metrics_schema(names)
    wd, part = survivors.wd, item["part"]
    metrics_out = wd.part(wd.part_scratch(STAGE, "", part), schema)
    removed_out = wd.part(wd.removed(STAGE, part), REMOVED_SCHEMA)
    override_out = wd.part(wd.overrides(STAGE, part), OVERRIDE_SCHEMA)
    stats = {"documents_in": 0, "bytes_in": 0, "removed": {}, "removed_bytes": 0, "texts_shortened": 0}
    for t in survivors.docs(part, COLUMNS, 1024):
        rows = t.to_pydict()
        srcs = [item["sources"][source] for source in rows["source"]]
        verdicts = [evaluate(text, cfgs[src], sets[src]) for text, src in zip(rows["text"], srcs)]
        # column by column: the batch's rows are the documents'; the removed and shortened ones are few
        cols = {"id": rows["id"], "order": rows["order"], "part": rows["part"], "reason": [v.reason for v in verdicts],
                **{name: [v.metrics.get(name) for v in verdicts] for name in names}}
        removed = {k: [] for k in ("id", "order", "part", "bytes", "reason", "value", "threshold")}
        over = {k: [] for k in OVERRIDE_SCHEMA.names}
        stats["documents_in"] += len(verdicts)
        stats["bytes_in"] += sum(rows["bytes"])
        for j, v in enumerate(verdicts):
            if v.reason is None and v.text is None:
                continue
            i, order, part, n = rows["id"][j], rows["order"][j], rows["part"][j], rows["bytes"][j]
            if v.reason is not None:
                stats["removed"][v.reason] = stats["removed"].get(v.reason, 0) + 1
                stats["removed_bytes"] += n
                for k, x in (("id", i), ("order", order), ("part", part), ("bytes", n), ("reason", v.reason),
                             ("value", v.value), ("threshold", float(v.threshold))):
                    removed[k].append(x)
            else:
                stats["texts_shortened"] += 1
                for k, x in (("id", i), ("order", order), ("part", part), ("text", v.text)):
                    over[k].append(x)
        metrics_out.write(cols)
        if removed["id"]:
            removed_out.write(to_removed_rows(pa.table(removed), STAGE))  # value, threshold -> detail
        override_out.write(over)
    for p in (metrics_out, removed_out, override_out):
        p.commit()
    return stats
