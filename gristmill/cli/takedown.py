"""``gristmill takedown DATA --doc-id ID ... | --url URL ... | --from-file F [--text PASSAGE] [--runs RUN ...]``:
remove documents and their near copies, publish the new version, list the checkpoints that saw them
(audit/takedown.py)."""
from __future__ import annotations

import json
import os
import sys


def register(sub) -> None:
    p = sub.add_parser("takedown", help="remove documents and their copies from a version, publish the new version, "
                                        "and list the checkpoints that trained on them")
    p.add_argument("data", help="the dataset version (<store>/<dataset>[/v<N>]) or mixture to take documents out of")
    p.add_argument("--doc-id", action="append", default=[], dest="doc_ids", help="a document id (repeatable)")
    p.add_argument("--url", action="append", default=[], dest="urls", help="a document URL, as the document index "
                                                                           "records it (repeatable)")
    p.add_argument("--from-file", help="a file of requests, one a line: `id ID`, `url URL` or `text PASSAGE` "
                                       "(a bare line is a URL when it is one, else an id; # starts a comment)")
    p.add_argument("--text", action="append", default=[], dest="texts",
                   help="a passage: documents holding the same text, or a near copy of it, are removed (repeatable)")
    p.add_argument("--reason", default="takedown request", help="why, recorded in the manifest and the report "
                                                              "(e.g. 'GDPR Art. 17 request #123')")
    p.add_argument("--runs", nargs="+", default=[], metavar="RUN",
                   help="run directories (or checkpoints) to check: every checkpoint that trained on a removed document")
    p.add_argument("--repin", nargs="+", default=[], metavar="MIXTURE",
                   help="mixtures to publish again pinning the new version instead of the old")
    p.add_argument("--dry-run", action="store_true", help="find and report; publish nothing")
    p.add_argument("--report", help="write the report here (.md; the JSON beside it as .json); default: "
                                    "takedown-<dataset>-<UTC time>.md in the current directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a summary")
    p.set_defaults(handler=_takedown)


def read_requests(path: str) -> tuple[list[str], list[str], list[str]]:
    """(ids, urls, texts) from a request file."""
    from gristmill.errors import UsageError
    from gristmill.manifests.storage import is_url

    ids, urls, texts = [], [], []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"--from-file {path}: {e.strerror or e}") from None
    for line in (x.strip() for x in lines):
        if not line or line.startswith("#"):
            continue
        kind, _, rest = line.partition(" ")
        if kind in ("id", "url", "text") and rest.strip():
            {"id": ids, "url": urls, "text": texts}[kind].append(rest.strip())
        else:
            (urls if is_url(line) else ids).append(line)
    return ids, urls, texts


def _takedown(args) -> int:
    from gristmill.audit.takedown import report_markdown, takedown
    from gristmill.errors import UsageError
    from gristmill.pipeline.takedown import Request

    ids, urls, texts = list(args.doc_ids), list(args.urls), list(args.texts)
    if args.from_file:
        more = read_requests(args.from_file)
        ids, urls, texts = ids + more[0], urls + more[1], texts + more[2]
    if not (ids or urls or texts):
        raise UsageError("takedown: name documents with --doc-id, --url, --text or --from-file")
    if args.report and not args.report.endswith(".md"):
        raise UsageError(f"--report {args.report}: use a .md file name (the JSON is written beside it)")
    report = takedown(args.data, Request(tuple(ids), tuple(urls), tuple(texts), args.reason), runs=args.runs,
                      repin_mixtures=args.repin, dry_run=args.dry_run)
    stamp = report["created_at"].replace(":", "").replace("+0000", "Z")
    path = args.report or f"takedown-{report['versions'][0]['dataset']}-{stamp}.md"
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(report_markdown(report))
    os.replace(path + ".tmp", path)
    with open(path[:-3] + ".json.tmp", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    os.replace(path[:-3] + ".json.tmp", path[:-3] + ".json")
    if args.json:
        json.dump(report, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    for v in report["versions"]:
        name = f"{v['dataset']} v{v['parent']['version']}" + (f" (component {v['component']})" if v["component"] else "")
        print(f"{name}: {len(v['removed'])} documents to remove (near copies at Jaccard >= {v['threshold']})")
        for d in v["removed"]:
            sim = "" if d["similarity"] is None else f" similarity {d['similarity']:.3f}"
            print(f"  {d['doc_id']:<30} {d['match']} of {d['target']}{sim}")
        if v["new"]:
            n = v["new"]
            print(f"published {v['dataset']} v{n['version']}: {n['url']} (sha256 {n['sha256']}); shards rewritten "
                  f"{len(n['shards_rewritten'])}, dropped {len(n['shards_dropped'])}, reused {n['shards_reused']}")
    for mx in report["mixtures"]:
        if mx.get("new"):
            print(f"re-pinned mixture {mx['mixture']} -> v{mx['new']['version']} {mx['new']['url']}")
    for e in report["runs"]:
        if e.get("error"):
            print(f"  {e['checkpoint'] or e['run']}: could not be audited: {e['error']}")
        elif e["documents"]:
            print(f"  {e['checkpoint']} (step {e['step']}) trained on " + "; ".join(
                f"{d} at steps {', '.join(map(str, s))}" for d, s in e["documents"].items()))
    if report["runs"]:
        hits = sum(1 for e in report["runs"] if e.get("documents"))
        print(f"{hits} of {len(report['runs'])} checkpoints trained on a removed document")
    if report["not_found"]:
        print("not found: " + ", ".join(report["not_found"]))
    print(f"report: {path} and {path[:-3]}.json")
    return 0
