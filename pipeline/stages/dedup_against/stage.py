"""Dedup against published versions (the job's ``dedup_against``): this run's documents that
exactly or nearly duplicate a document of an earlier version are removed, naming that version
and document; the earlier versions are only read (their manifests and dedup indexes, each
hash-checked), never written.

The driver loads each earlier manifest (pinned by the job's ``sha256`` when it gives one; the
hash it read goes into the new manifest's ``dedup_against``) and lists its dedup index files;
the steps of its ``tasks`` (keys, candidates, fetch, match) then join the new
documents with those files by join key, bucket range by bucket range: each index file is read
and hash-checked by one task (a corrupted or forged file is refused like a forged shard), and no
task reads the whole index.
"""
from __future__ import annotations

from gristmill.manifests import join, load_manifest
from gristmill.manifests.store import confined_file
from gristmill.manifests import dedup_index as dx
from gristmill.manifests.manifest import PinnedVersion

from ... import dedup_index as di
from ...fuzzy_config import FuzzyDedupConfig
from ..base import Context, Stage, StageResult
from . import tasks as da
from .config import DedupAgainstSpec


class DedupAgainst(Stage):
    name, section, config, removes = da.STAGE, "dedup_against", tuple[DedupAgainstSpec, ...], True
    default = ()  # earlier versions whose documents this run's may not repeat; none: off

    def __init__(self, versions: tuple[DedupAgainstSpec, ...], fuzzy: FuzzyDedupConfig):
        self.versions, self.fuzzy = versions, fuzzy

    @classmethod
    def from_job(cls, job) -> "DedupAgainst | None":
        # matched with fuzzy dedup's settings (its defaults when the job has no fuzzy_dedup section)
        versions = cls.section_of(job)
        return None if versions is None else cls(versions, job.fuzzy_dedup or FuzzyDedupConfig())

    def run(self, ctx: Context) -> StageResult:
        cfg = self.fuzzy
        params = di.index_params(cfg)
        pins, files = [], []
        for spec in self.versions:
            pub = load_manifest(spec.url, expected_sha256=spec.sha256, confined=not spec.follow_symlinks)
            m = pub.manifest
            if not spec.follow_symlinks:  # each index file must lie in its version dir (read by a task later)
                for ref in m.dedup_index:
                    confined_file(join(pub.url, ref.path), pub.url)
            label = f"{m.dataset} v{m.version}"
            if not m.dedup_index:
                dx.read_published(pub)  # raises: published without a dedup index, and what to do
            pins.append(PinnedVersion(spec.url, m.dataset, m.version, m.sha256))
            files += [{"url": join(pub.url, ref.path), "path": ref.path, "sha256": ref.sha256, "bytes": ref.bytes,
                       "rows": ref.rows, "label": f"{label} ({spec.url})", "version": label, "version_url": pub.url,
                       "version_sha256": m.sha256} for ref in m.dedup_index]
        flow, detail = da.dedup_against(ctx.runner, ctx.survivors, ctx.part_numbers(), params,
                                        cfg.threshold, files, cfg.batch_size)
        detail = {"versions": [{"url": p.url, "dataset": p.dataset, "version": p.version, "sha256": p.sha256} for p in pins],
                  **detail}
        return StageResult(self.name, flow=flow, detail=detail, dedup_against=tuple(pins))
