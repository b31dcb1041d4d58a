"""Extract (+ language): read every input record, quarantine the unreadable, identify the
language, hash for exact dedup; a task per partition (``pipeline.extract``). Its two rows of the
stage table (``extract``, ``language``) start the document flow."""
from __future__ import annotations

import functools

from ..documents import LANGUAGE
from ..extract import extract_partition
from ..stats import Accounting, summed
from .base import Context, Stage, StageResult


class Extract(Stage):
    name, section, kind = "extract", "extract", "map"

    def run(self, ctx: Context) -> StageResult:
        job = ctx.job
        fn = functools.partial(extract_partition, extract=job.extract, language=job.language, wd=ctx.wd,
                               batch_rows=job.ray.records_per_batch)
        # each file with its input entry's own minimum length and language threshold (per source)
        items = [{**it, "files": [{**f, "min_chars": job.inputs[f["input"]].min_chars,
                                   "language_threshold": job.inputs[f["input"]].language_threshold} for f in t["files"]]}
                 for it, t in zip(ctx.per_partition(), ctx.partitions)]
        stats = ctx.runner.run(self.name, items, fn,
                               measure=lambda s: (s["extract"]["records"], sum(f["bytes"] for f in s["inputs"])))
        ex = summed((s["extract"] for s in stats), ("records", "documents", "bytes_out", "quarantined", "seconds"))
        lg = summed((s["language"] for s in stats),
                    ("documents_in", "bytes_in", "documents_out", "bytes_out", "removed", "languages", "seconds"))
        inputs = [f for s in stats for f in s["inputs"]]
        bytes_in = sum(f["bytes"] for f in inputs)
        rows = {"extract": {"documents_in": ex["records"], "documents_out": ex["documents"], "bytes_in": bytes_in,
                            "bytes_out": ex["bytes_out"], "quarantined": ex["quarantined"]},
                "language": {k: lg[k] for k in ("documents_in", "bytes_in", "documents_out", "bytes_out", "removed",
                                                 "languages")}}
        return StageResult(
            self.name, rows=rows, flow_start=(lg["documents_out"], lg["bytes_out"]), inputs=inputs,
            accounting=Accounting(input=ex["records"], removed=lg["removed"], quarantined=ex["quarantined"]),
            core_seconds={"extract": ex["seconds"], "language": lg["seconds"]},
            peak_rss_mb={"extract": max((s.get("peak_rss_mb", 0) for s in stats), default=0)},
            removed_files=((LANGUAGE, ""),), data={"documents": lg["documents_out"]})
