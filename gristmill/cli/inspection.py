"""``gristmill inspect removed RUN_OR_WORKDIR``: what a run dropped, and why, with the text
(``pipeline.removals`` reads it; this module prints it). Named ``inspection``, not ``inspect``:
a module must not shadow the standard library's."""
from __future__ import annotations

import json
import sys
import textwrap

from gristmill.errors import UsageError

from .common import add_storage_option_arguments, storage_options


def register(sub) -> None:
    p = sub.add_parser("inspect", help="look at what a prepare run removed")
    isub = p.add_subparsers(dest="inspect_command", required=True, metavar="WHAT")
    r = isub.add_parser("removed", help="removed documents with their text; a duplicate beside its survivor")
    r.add_argument("run", help="the job's work_dir (its latest run) or a run dir (report.json's run_dir)")
    r.add_argument("--reason", help="only this removal reason (e.g. near_duplicate, exact_duplicate, language, contaminated)")
    r.add_argument("--stage", help="only this stage's removals (language, exact_dedup, fuzzy_dedup, decontaminate, ...)")
    r.add_argument("--limit", type=int, default=20, help="at most this many documents (default 20)")
    r.add_argument("--width", type=int, default=120, help="line width of the text columns (default 120)")
    r.add_argument("--json", action="store_true", help="the documents as JSON, full texts")
    add_storage_option_arguments(r, "work-dir-option", "the work dir (the job's work_dir_options)")
    r.set_defaults(handler=_removed)


def _removed(args) -> int:
    from gristmill.pipeline.removals import removed_documents

    if args.limit < 0:
        raise UsageError(f"--limit: expected an integer >= 0, got {args.limit}")
    result = removed_documents(args.run, reason=args.reason, stage=args.stage, limit=args.limit,
                               storage_options=storage_options(args, "work-dir-option"))
    if result["runs_found"] > 1:
        print(f"{args.run} holds {result['runs_found']} runs; showing the latest, {result['run_dir']} "
              "(give a run dir to choose)", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1, ensure_ascii=False))
    else:
        print(format_removed(result, width=args.width), end="")
    return 0


def format_removed(result: dict, width: int = 100, lines: int = 6) -> str:
    """The documents as blocks: a header line, then the text (beside its survivor's for a duplicate)."""
    counts = ", ".join(f"{k} {v:,}" for k, v in result["removed_by_reason"].items())
    out = [f"run {result['run_dir']}: removed {counts or 'nothing'}", ""]
    col = max(20, (width - 3) // 2)
    for n, d in enumerate(result["documents"], 1):
        where = f"{d['source']}:{d['position']}" if d["source"] else ""
        extra = {k: v for k, v in d["detail"].items() if k not in ("duplicate_of", "duplicate_of_order", "cluster")}
        out.append(_printable(f"[{n}] {d['reason']} ({d['stage']})  {d['id']}  {where}  {d['url'] or ''}".rstrip())
                   + (f"  {json.dumps(extra, sort_keys=True)}" if extra else ""))
        left = _wrap(d["text"], col, lines)
        if "survivor" in d:
            s = d["survivor"]
            right = _wrap(s["text"], col, lines)
            out.append(f"    {'removed'.ljust(col)} | survivor {_printable(s['id'])}")
            for a, b in zip(left + [""] * (len(right) - len(left)), right + [""] * (len(left) - len(right))):
                out.append(f"    {a.ljust(col)} | {b}".rstrip())
        else:
            out += [f"    {a}" for a in _wrap(d["text"], width - 4, lines)]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _printable(s: str) -> str:
    """``s`` with its control (and other unprintable) characters escaped, ``\\n`` for a newline: an id,
    URL or file name from the data cannot start a line of its own (a forged header)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def _wrap(text: str | None, width: int, lines: int) -> list[str]:
    if text is None:
        return ["(text not found in the run dir)"]
    wrapped = textwrap.wrap(" ".join(text.split()), width) or [""]
    return wrapped[:lines - 1] + ["…"] if len(wrapped) > lines else wrapped
