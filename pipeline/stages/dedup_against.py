"""Dedup against published versions (the job's ``dedup_against``): this run's documents that
exactly or nearly duplicate a document of an earlier version are removed, naming that version
and document; the earlier versions are only read (their manifests and dedup indexes, each
hash-checked), never written.

Steps: the driver loads each earlier manifest (pinned by the job's ``sha256`` when it gives one;
the hash it read goes into the new manifest's ``dedup_against``) and each of its dedup index files,
checked against the manifest's entry before anything uses it (a corrupted or forged file is
refused like a forged shard) and kept in the work dir, one file at a time; then
``dedup_against.match``, a task per partition, compares the partition's surviving documents with
every loaded index file (``pipeline.dedup_index.match``) and writes ``removed/dedup_against/part-N``.
"""
from __future__ import annotations

import functools

from gristmill.manifests import join, load_manifest
from gristmill.manifests import dedup_index as dx
from gristmill.manifests.manifest import PinnedVersion

from .. import dedup_index as di
from ..config import FuzzyDedupConfig
from ..stats import Counts
from .base import Context, Stage, StageResult


class DedupAgainst(Stage):
    name, section, kind, removes = "dedup_against", "dedup_against", "global", True

    def run(self, ctx: Context) -> StageResult:
        cfg = ctx.job.fuzzy_dedup or FuzzyDedupConfig()
        params = di.index_params(cfg)
        pins, sources, index_rows = [], [], 0
        for k, spec in enumerate(ctx.job.dedup_against):
            pub = load_manifest(spec.url, expected_sha256=spec.sha256)
            m = pub.manifest
            label = f"{m.dataset} v{m.version}"
            if not m.dedup_index:
                dx.read_published(pub)  # raises: published without a dedup index, and what to do
            pins.append(PinnedVersion(spec.url, m.dataset, m.version, m.sha256))
            for i, ref in enumerate(m.dedup_index):
                name = f"against-{k:03d}-{i:05d}"
                index_rows += di.load_index_file(join(pub.url, ref.path), ref, params, f"{label} ({spec.url})",
                                                 ctx.wd.scratch(self.name, "index", name))
                sources.append({"name": name, "version": label, "url": pub.url, "sha256": m.sha256})
        stats = ctx.runner.run(f"{self.name}.match", ctx.per_partition(), functools.partial(
            di.match_task, wd=ctx.wd, survivors=ctx.survivors, params=params, threshold=cfg.threshold, sources=sources,
            batch_size=cfg.batch_size))
        ctx.survivors = ctx.survivors.after(self.name, removed=True)
        flow = Counts.of_tasks(stats)
        detail = {"versions": [{"url": p.url, "dataset": p.dataset, "version": p.version, "sha256": p.sha256} for p in pins],
                  "index_rows": index_rows,
                  "threshold": cfg.threshold, "documents_removed": sum(flow.removed.values())}
        return StageResult(self.name, flow=flow, detail=detail, removed_files=((self.name, ""),), dedup_against=tuple(pins))
