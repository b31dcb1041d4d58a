"""Extract (+ language): read every input record, quarantine the unreadable, identify the
language, hash for exact dedup; a task per partition (``tasks.extract_partition``). Its two rows of the
stage table (``extract``, ``language``) start the document flow."""
from __future__ import annotations

import functools
from ...documents import LANGUAGE
from ...handoffs import Extracted
from ...id_files import needs_id_check
from ...stats import Accounting, summed
from ...survivors import Verdicts
from ..base import Context, JobSection, Stage, StageResult
from . import tasks as extract
from .config import ExtractConfig, LanguageConfig


class Extract(Stage):
    name, names, section, config, default = extract.STAGE, (extract.STAGE, LANGUAGE), "extract", ExtractConfig, ExtractConfig()
    more_sections = (JobSection("language", LanguageConfig, LanguageConfig()),)  # its filter's

    def __init__(self, job):
        self.extract, self.language, self.batch_rows = job.extract, job.language, job.partitioning.records_per_batch
        self.check_ids = needs_id_check(job)
        # each input entry's own minimum length, language threshold and store (per source)
        self.sources = tuple(extract.Source(spec.min_chars, spec.language_threshold, spec.store()) for spec in job.inputs)

    @classmethod
    def from_job(cls, job) -> "Extract":
        return cls(job)  # always runs

    def verdicts(self) -> tuple[Verdicts, ...]:
        # the language filter's removals: written for the record; docs/ holds only what it kept
        return (Verdicts(removed=True, stage=LANGUAGE, applied=False),)

    def run(self, ctx: Context) -> StageResult:
        fn = functools.partial(extract.extract_partition, extract=self.extract, language=self.language, wd=ctx.wd,
                               batch_rows=self.batch_rows, sources=self.sources)
        items = [{**it, "check_ids": self.check_ids, "files": t.files} for it, t in zip(ctx.per_partition(), ctx.partitions)]
        stats = ctx.runner.run(self.name, items, fn,
                               measure=lambda s: (s["extract"]["records"], sum(f["bytes"] for f in s["inputs"])))
        ex = summed((s["extract"] for s in stats), ("records", "documents", "bytes_out", "quarantined", "seconds"))
        lg = summed((s["language"] for s in stats),
                    ("documents_in", "bytes_in", "documents_out", "bytes_out", "removed", "languages", "seconds"))
        inputs = [f for s in stats for f in s["inputs"]]
        bytes_in = sum(f["bytes"] for f in inputs)
        rows = {self.name: {"documents_in": ex["records"], "documents_out": ex["documents"], "bytes_in": bytes_in,
                            "bytes_out": ex["bytes_out"], "quarantined": ex["quarantined"]},
                LANGUAGE: {k: lg[k] for k in ("documents_in", "bytes_in", "documents_out", "bytes_out", "removed",
                                              "languages")}}
        return StageResult(
            self.name, rows=rows, flow_start=(lg["documents_out"], lg["bytes_out"]), inputs=inputs,
            accounting=Accounting(input=ex["records"], removed=lg["removed"], quarantined=ex["quarantined"]),
            core_seconds={self.name: ex["seconds"], LANGUAGE: lg["seconds"]},
            peak_rss_mb={self.name: max((s.get("peak_rss_mb", 0) for s in stats), default=0)},
            artifact=Extracted(documents=lg["documents_out"], records=lg["documents_in"]))
