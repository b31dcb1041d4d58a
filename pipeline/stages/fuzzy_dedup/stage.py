"""Fuzzy dedup's orchestration: the steps of its ``tasks`` (bands, candidates,
members, verify, components, assign, removed) as tasks over the work dir, and its statistics."""
from __future__ import annotations

import functools

from ... import connected_components as cc
from ...runner import Runner
from ...stats import Counts, summed
from ...survivors import Survivors
from ...workdir import part_name
from ..base import Context, Stage, StageResult
from . import tasks as fd
from .config import FuzzyDedupConfig


class FuzzyDedup(Stage):
    name, section, config, removes = fd.STAGE, "fuzzy_dedup", FuzzyDedupConfig, True
    default = None  # absent (or null): the stage does not run

    def __init__(self, cfg: FuzzyDedupConfig):
        self.cfg = cfg

    def run(self, ctx: Context) -> StageResult:
        flow, detail = find_near_duplicates(ctx.runner, ctx.survivors, ctx.part_numbers(), self.cfg)
        return StageResult(self.name, flow=flow, detail=detail)


def find_near_duplicates(runner: Runner, survivors: Survivors, parts: list[int], cfg: FuzzyDedupConfig
                         ) -> tuple[Counts, dict]:
    """Every step over partitions ``parts``' surviving documents (texts as rewritten by earlier
    stages); writes ``removed/fuzzy_dedup/block-B`` and returns the counts and the detail."""
    wd, d, params = survivors.wd, fd.STAGE, cfg.lsh()
    per_part = [{"name": part_name(p), "part": p} for p in parts]
    bands = runner.run(f"{d}.bands", per_part, functools.partial(fd.bands_task, cfg=cfg, params=params, survivors=survivors))
    ranges = fd.plan_bucket_ranges(sum(s["band_rows"] for s in bands))
    cand_items = [{"name": f"task-{i:03d}", "lo": lo, "hi": hi} for i, (lo, hi) in enumerate(ranges)]
    cand = runner.run(f"{d}.candidates", cand_items,
                      functools.partial(fd.candidates_task, wd=wd, bands=wd.whole_files(
                          [wd.part_scratch(d, "bands", p) for p in parts])))
    cand_names = [it["name"] for it in cand_items]
    runner.run(f"{d}.members", per_part, functools.partial(fd.members_task, cfg=cfg, survivors=survivors,
                                                           candidates=cand_names))
    buckets = cc.bucket_count(2 * sum(s["pairs"] for s in cand))
    ver = runner.run(f"{d}.verify", [{**it, "buckets": buckets} for it in per_part],
                     functools.partial(fd.verify_task, cfg=cfg, wd=wd, candidates=cand_names))
    n_linked = sum(s["pairs_linked"] for s in ver)
    star_files = cc.connected_components(runner, wd, d, f"{d}.components",
                                         wd.whole_files([wd.part_scratch(d, "edges", p) for p in parts]), buckets) if n_linked else []
    assign_items = [{"name": f"bucket-{b:05d}", "bucket": b} for b in range(buckets)] if n_linked else []
    assigned = runner.run(f"{d}.assign", assign_items, functools.partial(
        fd.assign_task, wd=wd, star_files=star_files, links=wd.whole_files([wd.part_scratch(d, "links", p) for p in parts])))
    rem = runner.run(f"{d}.removed", per_part, functools.partial(
        fd.removed_task, cfg=cfg, wd=wd, assigned=[it["name"] for it in assign_items]))
    flow = Counts.of_tasks(rem)
    hist = {int(k): v for k, v in summed(s["cluster_sizes"] for s in assigned).items()}
    detail = {
        "documents_in": sum(s["documents_in"] for s in bands),
        "documents_removed": sum(flow.removed.values()),
        "lsh": params.to_dict(),
        "config": cfg.to_dict(),
        "candidate_pairs": sum(s["candidate_pairs"] for s in ver),
        "pairs_linked": n_linked,
        "clusters": sum(hist.values()),
        "cluster_sizes": {str(size): hist[size] for size in sorted(hist)},
        # by input order: the removed document, its survivor, the one that linked it
        "sample_pairs": [p for s in rem for p in s["sample"]][: cfg.sample_pairs],
    }
    return flow, detail
