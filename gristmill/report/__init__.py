"""HTML reports: a data card for every dataset version, a page for every training run.

``build_report(target)`` reads a dataset version (manifest, document index, and the prepare
run's work dir when found) or a training run dir (metrics.jsonl, checkpoints, the audit) into
a ``Page``; ``write_page`` renders it as one self-contained HTML file with matplotlib figures
(the ``report`` extra) or, without it, as plain-text tables. docs/reports.md describes every figure.

Layering: like the CLI, this package reads every part's files and functions (manifests,
pipeline work-dir helpers, audit, trainer.meta); loader/ and trainer/ never import it, and the
pipeline only calls ``write_dataset_report`` at the end of a prepare, lazily.
"""
from __future__ import annotations

import logging
import os

from gristmill.manifests.storage import local_path

from .page import Page, render, render_text, write_page

log = logging.getLogger("gristmill.report")
HTML_FILE = "report.html"


def build_report(target: str, *, work_dir: str | None = None, work_dir_options: dict | None = None,
                 storage_options: dict | None = None) -> tuple[Page, str]:
    """(page, default output path) for a training run dir or a dataset version URL; ``storage_options``:
    the stores it reads (the version's, a run's checkpoints and data: credentials, an endpoint);
    ``work_dir_options``: the storage options of ``work_dir`` (the job's: its credentials may be
    nowhere else)."""
    from .training import is_run_dir, run_page

    if is_run_dir(target, storage_options):  # a local run dir, or a checkpoint dir on a store (the page is written here)
        return run_page(target, storage_options), os.path.join(target if local_path(target) is not None else ".", HTML_FILE)
    from .dataset import build

    page, run_dir = build(target, work_dir, work_dir_options, storage_options)
    if run_dir:
        return page, os.path.join(run_dir, HTML_FILE)
    title = page.title.replace(" ", "-")
    return page, f"{title}.html"


def write_dataset_report(published, run_dir: str, work_dir_options: dict | None = None) -> str | None:
    """``prepare``'s last step: ``<run_dir>/report.html`` beside report.json, the run dir read and
    written with the job's ``work_dir_options``. Never raises: a page that cannot be drawn must not
    fail a run whose data is published; it is logged."""
    from gristmill.manifests.storage import Store, is_url

    path = f"{run_dir.rstrip('/')}/{HTML_FILE}" if is_url(run_dir) else os.path.join(run_dir, HTML_FILE)
    try:
        from .dataset import dataset_page

        write_page(dataset_page(published, run_dir, work_dir_options=work_dir_options), path,
                   Store.from_url(run_dir, **(work_dir_options or {})))
        return path
    except Exception:  # noqa: BLE001 - any failure of the page is only logged (see above)
        log.warning("could not write %s; `gristmill report %s --work-dir %s` retries it", path, published.url, run_dir,
                    exc_info=True)
        return None


__all__ = ["HTML_FILE", "Page", "build_report", "render", "render_text", "write_dataset_report", "write_page"]
