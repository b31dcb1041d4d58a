"""``gristmill report DATASET_URL | RUN_DIR``: an HTML page of a dataset version or a training run."""
from __future__ import annotations

import os
import sys

from gristmill.errors import UsageError, os_error_text

from .common import add_storage_option_arguments, storage_options


def register(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page: a dataset version's data card, or a training run")
    p.add_argument("target", help="a dataset version (<root>/<dataset>[/v<N>]) or a training run dir (holds metrics.jsonl)")
    p.add_argument("--work-dir", help="dataset: the prepare job's work_dir (or its run dir), for the figures that need "
                                      "its files (lengths, language scores, quoted documents)")
    p.add_argument("--out", help="the HTML file to write (default: report.html in the run dir; for a dataset whose "
                                 "run dir is not found, <dataset>-v<N>.html here)")
    p.add_argument("--text", action="store_true", help="print the page's tables as plain text instead of writing HTML")
    add_storage_option_arguments(p, of="the target's stores (a version's; a run's checkpoints and data)")
    add_storage_option_arguments(p, "work-dir-option", "the --work-dir (the job's work_dir_options)")
    p.set_defaults(handler=_report)


def _report(args) -> int:
    from gristmill.manifests.storage import Store
    from gristmill.report import build_report
    from gristmill.report.page import EXTRA_HINT, render_text, write_page

    options = storage_options(args, "work-dir-option")
    page, default_out = build_report(args.target, work_dir=args.work_dir, work_dir_options=options,
                                     storage_options=storage_options(args))
    if args.text:
        sys.stdout.write(render_text(page))
        return 0
    out = args.out or default_out
    if args.out and os.path.isdir(out):  # a folder: the page goes in it, under its default name
        out = os.path.join(out, os.path.basename(default_out))
    try:
        # the default goes in the run dir: written with its options (a local path takes none)
        full = write_page(page, out, Store.from_url(out, **options) if out == default_out else None)
    except OSError as e:  # /proc/x.html, a read-only or full disk: one line, never a traceback
        raise UsageError(f"--out {out}: cannot write the page: {os_error_text(e, 'choose another --out')}") from None
    print(f"wrote {out}" + ("" if full else f" (tables only: {EXTRA_HINT} for the figures)"))
    return 0
