"""``gristmill prepare JOB.yaml``: the pipeline's ``prepare(job)``, then the data card (report.html)."""
from __future__ import annotations

import sys

from .common import add_job_arguments, load_job


def register(sub) -> None:
    p = sub.add_parser("prepare", help="raw corpora -> a published, content-hashed token dataset (Ray tasks over files)")
    add_job_arguments(p, "job YAML file (see docs/pipeline.md)")
    p.add_argument("--address", help="Ray cluster address to run on: the ray runner, overriding runner.address "
                                     "(default: RAY_ADDRESS under `ray job submit`, else worker processes on this "
                                     "machine; see runner.kind)")
    p.add_argument("--quiet", action="store_true", help="no per-stage progress lines")
    p.set_defaults(handler=_prepare)


def _prepare(args) -> int:
    from gristmill.pipeline.config import load_job as load

    job = load_job(args, load)
    if job is None:
        return 0
    from gristmill.pipeline.executor import PrepareInterrupted, prepare
    from gristmill.pipeline.stats import format_table

    try:
        result = prepare(job, address=args.address, quiet=args.quiet)
    except PrepareInterrupted as e:  # Ctrl-C or SIGTERM: workers are down, finished tasks are kept; one line
        print(f"gristmill: {e}", file=sys.stderr, flush=True)
        return 128 + e.signum
    if job.output.report_html:
        write_data_card(result, quiet=args.quiet, storage_options=job.output.storage_options,
                        work_dir_options=job.work_dir_options)
    print(format_table(result.report))
    return 0 if result.report["accounting"]["balanced"] else 1


def write_data_card(result, *, quiet: bool = False, storage_options: dict | None = None,
                    work_dir_options: dict | None = None) -> str | None:
    """report.html beside report.json in the run dir. Drawing a page never fails a run whose data
    is published: a broken report install or a page that cannot be drawn is one line on stderr.
    ``storage_options``: the output store's (``output.storage_options``), to read the manifest back;
    ``work_dir_options``: the run dir's (``work_dir_options``), to read its files and write the page."""
    def note(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    try:
        from gristmill.manifests import load_manifest
        from gristmill.report import write_dataset_report
    except Exception as e:  # noqa: BLE001 - a broken report install must not fail prepare
        note(f"[report] report.html not written: {type(e).__name__}: {e}")
        return None
    path = write_dataset_report(load_manifest(result.url, expected_sha256=result.manifest_sha256, **(storage_options or {})), result.run_dir, work_dir_options)
    if path:
        note(f"[report] {path}")
    return path
