"""What the dataset report reads from a prepare run's work dir (``<work_dir>/<run key>/``).

The manifest holds the counts; the work dir holds what a figure needs beyond them: per-document
lengths and language scores (``docs/``, ``removed/language/``), which documents later stages
removed (``removed/<stage>/``), and the texts of the few documents the page quotes. Only
narrow columns are read (``bytes``, ``order``, ``lang_score``), never the text of every
document; texts are read for quoted documents only, by partition and row-group filter.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gristmill.pipeline.documents import PART_SHIFT
from gristmill.pipeline.workdir import part_name

REPORT_FILE = "report.json"


def find_run_dir(work_dir: str, manifest_sha256: str) -> str | None:
    """The run dir under ``work_dir`` (a job's ``work_dir`` or a run dir itself) whose report.json
    names this manifest; the newest when several do."""
    found = []
    for path in [os.path.join(work_dir, REPORT_FILE)] + glob.glob(os.path.join(work_dir, "*", REPORT_FILE)):
        try:
            with open(path) as f:
                rep = json.load(f)
        except (OSError, ValueError):
            continue
        if rep.get("manifest_sha256") == manifest_sha256:
            found.append((os.path.getmtime(path), os.path.dirname(path)))
    return max(found)[1] if found else None


class WorkFiles:
    def __init__(self, run_dir: str):
        self.root = run_dir
        with open(os.path.join(run_dir, REPORT_FILE)) as f:
            self.report = json.load(f)

    def _files(self, *parts: str) -> list[str]:
        return sorted(glob.glob(os.path.join(self.root, *parts)))

    def docs_files(self) -> list[str]:
        return self._files("docs", "part-*.parquet")

    def removed_files(self, stage: str | None = None) -> list[str]:
        return self._files("removed", stage or "*", "*.parquet")

    def lengths(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(bytes of every extracted document, bytes of those that reached the tokenizer), or None
        without the work files. A document cut by decontamination counts at its extracted length."""
        docs = self.docs_files()
        if not docs:
            return None
        kept = [pq.read_table(f, columns=["order", "bytes"]) for f in docs]
        lang = [pq.read_table(f, columns=["bytes"]).column("bytes").to_numpy() for f in self.removed_files("language")]
        later = [pq.read_table(f, columns=["order"]).column("order").to_numpy()
                 for f in self.removed_files() if os.path.basename(os.path.dirname(f)) != "language"]
        order = np.concatenate([t.column("order").to_numpy() for t in kept])
        size = np.concatenate([t.column("bytes").to_numpy() for t in kept])
        gone = np.concatenate(later) if later else np.zeros(0, np.int64)
        before = np.concatenate([size, *lang])
        return before, size[~np.isin(order, gone)]

    def language_scores(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(scores of the kept documents, scores of the ones the language stage removed)."""
        docs = self.docs_files()
        if not docs:
            return None
        kept = np.concatenate([pc.fill_null(pq.read_table(f, columns=["lang_score"]).column("lang_score"), np.nan)
                               .to_numpy(zero_copy_only=False) for f in docs])
        removed = [json.loads(d).get("lang_score") for f in self.removed_files("language")
                   for d in pq.read_table(f, columns=["detail"]).column("detail").to_pylist()]
        return kept[~np.isnan(kept)], np.array([s for s in removed if s is not None], dtype=np.float64)

    def texts(self, *, orders=(), ids=()) -> dict:
        """Texts of a few documents by ``order`` (keyed by order) and by ``id`` (keyed by id)."""
        out: dict = {}
        by_part: dict[int, list[int]] = {}
        for o in orders:
            by_part.setdefault(int(o) >> PART_SHIFT, []).append(int(o))
        for part, wanted in by_part.items():
            path = os.path.join(self.root, "docs", f"{part_name(part)}.parquet")
            if os.path.exists(path):
                t = pq.read_table(path, columns=["order", "text"], filters=[("order", "in", wanted)])
                out.update(zip(t.column("order").to_pylist(), t.column("text").to_pylist()))
        ids = list(ids)
        if ids:
            for path in self.docs_files():
                t = pq.read_table(path, columns=["id", "text"], filters=[("id", "in", ids)])
                out.update(zip(t.column("id").to_pylist(), t.column("text").to_pylist()))
        return out
