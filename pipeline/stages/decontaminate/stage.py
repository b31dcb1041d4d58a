"""Decontamination's orchestration (its ``tasks``): a per-partition map against the eval
n-gram index (built once on the driver from the small eval files, cached in the work dir) and
its report (a task that reads the verdicts the map left in the work dir); then, with
``against_validation``, the six steps of the pass against the dataset's own validation split:
its documents, its index, the corpus' document frequencies and the pruned index (the
boilerplate left out), the pass itself, and its report. The driver holds no list that grows
with the contamination found."""
from __future__ import annotations

import functools
from dataclasses import replace

from ...stats import Counts
from ...survivors import Survivors, Verdicts
from ...split_config import SplitConfig
from ..base import Context, Stage, StageResult
from . import tasks as decontam
from .config import DecontamConfig

VALIDATION_PREFIX = "val-"  # removed/decontaminate/val-block-N: the validation pass's own files


class Decontaminate(Stage):
    name, section, config, removes, rewrites = decontam.STAGE, "decontaminate", DecontamConfig, True, True
    default = None  # absent (or null): the stage does not run

    def __init__(self, cfg: DecontamConfig, split: SplitConfig, max_record_bytes: int | None = None):
        self.cfg, self.split = cfg, split
        self.max_record_bytes = max_record_bytes  # eval files are read within extract's record bound
        # the pass against the dataset's own validation split (its files: removed/decontaminate/val-block-N)
        self.against_validation = cfg.against_validation and split.validation_fraction > 0

    @classmethod
    def from_job(cls, job) -> "Decontaminate | None":
        cfg = cls.section_of(job)
        return None if cfg is None else cls(cfg, job.split, job.extract.max_record_bytes)

    def verdicts(self) -> tuple[Verdicts, ...]:
        both = Verdicts(removed=True, overrides=True)
        return (both, replace(both, prefix=VALIDATION_PREFIX)) if self.against_validation else (both,)

    def run(self, ctx: Context) -> StageResult:
        cfg, survivors = self.cfg, ctx.survivors
        loaded = decontam.load_eval_sets(cfg, self.max_record_bytes)
        decontam.build_eval_index(cfg, loaded, ctx.wd)  # saved in the work dir: the tasks load it there
        index_path = decontam.eval_index_path(cfg, loaded, ctx.wd)
        first = self._pass(ctx, survivors, self.name, index_path, "", None)
        detail = self._report(ctx, f"{self.name}.report", index_path, [r for r, _ in loaded], "", None)
        stats = list(first)
        if self.against_validation:
            # The validation pass sees the eval pass's cuts and removals, and only those: on a rerun a
            # validation task killed after committing its files must not read them as removals.
            second, val_detail = self._against_validation(ctx, survivors.applying(self.name, self.verdicts()[:1]))
            detail = {**detail, "against_validation": val_detail,
                      "eval_sets": list(detail.get("eval_sets", [])) + list(val_detail.get("eval_sets", []))}
            stats += second
        return StageResult(self.name, flow=Counts.of_tasks(stats), detail=detail,
                           eval_sets=list(detail.get("eval_sets", [])))

    def _against_validation(self, ctx: Context, survivors: Survivors) -> tuple[list[dict], dict]:
        cfg, split, wd, run = self.cfg, self.split, ctx.wd, ctx.runner.run
        step, scratch = f"{self.name}.validation", decontam.SCRATCH

        def files(kind: str) -> list[str]:  # every partition's rows of a per-partition step, block file by block file
            return wd.block_files(functools.partial(wd.part_scratch, scratch, kind), ctx.part_numbers())

        run(f"{step}_docs", ctx.per_partition(),
            functools.partial(decontam.validation_docs_task, survivors=survivors, split=split))
        val_path = wd.scratch(scratch, "", "validation", "npz")
        (built,) = run(f"{step}_index", [{"name": "index", "out": val_path}],
                       functools.partial(decontam.validation_index_task, cfg=cfg, wd=wd, files=files("validation")))
        pruned = None
        if cfg.validation_max_doc_freq is not None:  # boilerplate is not overlap: count, in tasks, then prune
            run(f"{step}_df", ctx.per_partition(), functools.partial(
                decontam.document_frequency_task, index_path=val_path, survivors=survivors))
            pruned_path = wd.scratch(scratch, "", "validation-pruned", "npz")
            (pruned,) = run(f"{step}_prune", [{"name": "prune", "out": pruned_path}], functools.partial(
                decontam.prune_index_task, wd=wd, index_path=val_path, files=files("validation_df"),
                max_doc_freq=cfg.validation_max_doc_freq))
            val_path = pruned_path
        second = self._pass(ctx, survivors, step, val_path, VALIDATION_PREFIX, split)
        val = self._report(ctx, f"{step}_report", val_path, [built["record"]], VALIDATION_PREFIX,
                           cfg.validation_min_matches)
        return second, {**val, "boilerplate_ngrams": pruned["boilerplate_ngrams"] if pruned else None,
                        "max_doc_freq": cfg.validation_max_doc_freq}

    def _report(self, ctx: Context, step: str, index_path: str, records: list[dict], prefix: str,
                min_matches: int | None) -> dict:
        """A pass's report, built in a task from the verdicts its partition tasks left in the work dir."""
        wd = ctx.wd
        files = wd.block_files(functools.partial(decontam.found_path, wd, prefix=prefix), ctx.part_numbers())
        (out,) = ctx.runner.run(step, [{"name": "report"}], functools.partial(
            decontam.report_task, cfg=self.cfg, wd=wd, index_path=index_path, records=records, files=files,
            min_matches=min_matches))
        return out["report"]

    def _pass(self, ctx: Context, survivors: Survivors, step: str, index_path: str, prefix: str, split) -> list[dict]:
        return ctx.runner.run(step, ctx.per_partition(), functools.partial(
            decontam.partition_task, cfg=self.cfg, index_path=index_path, survivors=survivors, split=split,
            prefix=prefix))
