"""What the dataset report reads from a prepare run's work dir (``<work_dir>/<run key>/``).

The manifest holds the counts; the work dir holds what a figure needs beyond them: per-document
lengths and language scores (``docs/``, ``removed/language/``), which documents later stages
removed (``removed/<stage>/``), and the texts of the few documents the page quotes. Only
narrow columns are read (``bytes``, ``order``, ``lang_score``), never the text of every
document; texts are read for quoted documents only, by partition and row-group filter.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.documents import PART_SHIFT
from gristmill.pipeline.workdir import WorkDir

from .hist import LOG_EDGES, UNIT_EDGES, Histogram

REPORT_FILE = "report.json"
BATCH = 65_536


def find_run_dir(work_dir: str, manifest_sha256: str, storage_options: dict | None = None) -> str | None:
    """The run dir under ``work_dir`` (a job's ``work_dir`` or a run dir itself, a directory or
    fsspec URL, opened with ``storage_options``) whose report.json names this manifest; the newest
    when several do."""
    found = []
    for run in WorkDir.runs_at(work_dir, storage_options):
        try:
            rep = json.loads(run.read_bytes(run.report_json))
        except (OSError, ValueError):
            continue
        if isinstance(rep, dict) and rep.get("manifest_sha256") == manifest_sha256:
            found.append(run.root)
    return found[-1] if found else None  # runs_at: oldest first


def older_run_dir(work_dir: str, manifest_sha256: str, storage_options: dict | None = None) -> str | None:
    """A run dir of an earlier layout (a file a partition: ``WorkDir.is_older_run``) under
    ``work_dir`` whose report.json names this manifest: its files are not read by this version,
    but the page says it was found, not that there is no report.json."""
    for run in reversed(WorkDir.runs_at(work_dir, storage_options, older=True)):
        try:
            if json.loads(run.read_bytes(run.report_json)).get("manifest_sha256") == manifest_sha256:
                return run.root
        except (OSError, ValueError, AttributeError):
            continue
    return None


class WorkFiles:
    def __init__(self, run_dir: str, storage_options: dict | None = None):
        self.wd = WorkDir(run_dir, storage_options)  # the job's work_dir_options: its credentials may be nowhere else
        self.report = json.loads(self.wd.read_bytes(self.wd.report_json))

    def docs_files(self) -> list[str]:
        return self.wd.docs_files()

    def removed_files(self, stage: str | None = None) -> list[str]:
        stages = [stage] if stage else self.wd.removal_stages()
        return [f for s in stages for f in self.wd.removed_files(s)]

    def lengths(self) -> tuple[Histogram, Histogram] | None:
        """Histograms of the UTF-8 bytes of every extracted document and of those that reached the
        tokenizer (``pipeline.survivors``, partition by partition), or None without the work files.
        A document cut by decontamination counts at its extracted length."""
        docs = self.docs_files()
        if not docs:
            return None
        before, after = Histogram(LOG_EDGES), Histogram(LOG_EDGES)
        for f in self.removed_files("language"):  # the language stage's removals are not in docs/
            before.add(self.wd.read_parquet(f, columns=["bytes"]).column("bytes").to_numpy())
        removed: dict[str, list[str]] = {}  # every stage's removals of a block's partitions: its block-K file
        for f in self.removed_files():
            removed.setdefault(_block_file(f), []).append(f)
        for f in docs:
            drop = pa.array(sorted({i for r in removed.get(_block_file(f), [])
                                    for i in self.wd.read_parquet(r, columns=["id"]).column("id").to_pylist()}), pa.string())
            for batch in self.wd.iter_batches(f, columns=["id", "bytes"], batch_size=BATCH):
                before.add(batch.column(1).to_numpy())
                after.add(batch.column(1).filter(pc.invert(pc.is_in(batch.column(0), drop))).to_numpy())
        return before, after

    def language_scores(self) -> tuple[Histogram, Histogram] | None:
        """Histograms of the language-ID scores of the documents kept and of those the language stage removed."""
        docs = self.docs_files()
        if not docs:
            return None
        kept, removed = Histogram(UNIT_EDGES), Histogram(UNIT_EDGES)
        for f in docs:
            for batch in self.wd.iter_batches(f, columns=["lang_score"], batch_size=BATCH):
                kept.add(pc.fill_null(batch.column(0), np.nan).to_numpy(zero_copy_only=False))
        for f in self.removed_files("language"):
            scores = [json.loads(d).get("lang_score") for d in self.wd.read_parquet(f, columns=["detail"]).column("detail").to_pylist()]
            removed.add([np.nan if x is None else x for x in scores])
        return kept, removed

    def texts(self, *, orders=(), ids=()) -> dict:
        """Texts of a few documents by ``order`` (keyed by order) and by ``id`` (keyed by id)."""
        out: dict = {}
        by_part: dict[int, list[int]] = {}
        for o in orders:
            by_part.setdefault(int(o) >> PART_SHIFT, []).append(int(o))
        for part, wanted in by_part.items():
            path = self.wd.docs(part)
            if self.wd.exists(path):
                t = self.wd.read_parquet(path, columns=["order", "text"], filters=[("order", "in", wanted)])
                out.update(zip(t.column("order").to_pylist(), t.column("text").to_pylist()))
        ids = list(ids)
        if ids:
            for path in self.docs_files():
                t = self.wd.read_parquet(path, columns=["id", "text"], filters=[("id", "in", ids)])
                out.update(zip(t.column("id").to_pylist(), t.column("text").to_pylist()))
        return out


def _block_file(path: str) -> str:
    """``block-00007.parquet`` of a block's file, whatever its prefix (``val-block-00007``: a
    stage's second pass over the same partitions): every kind's file of a block has the name."""
    name = path.rsplit("/", 1)[-1]
    return name[name.index("block-"):]
