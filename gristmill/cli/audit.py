"""``gristmill audit seen|doc|steps|leak``: what a checkpoint's model was trained on."""
from __future__ import annotations

import json
import sys

from .common import add_storage_option_arguments, storage_options

MAX_LINES = 30  # per breakdown in the human summary; --json and --out are complete


def register(sub) -> None:
    p = sub.add_parser("audit", help="what a checkpoint's model saw: rows, documents, eval-set leaks")
    asub = p.add_subparsers(dest="audit_command", required=True, metavar="ACTION")

    def common(q):
        q.add_argument("checkpoint", help="checkpoint dir (<run>/checkpoints/step-<N>), its meta.json, or a run dir (newest)")
        q.add_argument("--manifest", help="the dataset version if it moved since training (its hash must still match)")
        q.add_argument("--steps", help="only optimizer steps A to B inclusive (A:B, A:, :B or one step N; numbered "
                                       "from 1 as in step-<N>/); default: every step the checkpoint trained")
        q.add_argument("--json", action="store_true", help="print the answer as JSON instead of a summary")
        q.add_argument("--verify-checkpoint", action="store_true",
                       help="also re-hash the checkpoint's weight files against meta.json (reads every file)")
        add_storage_option_arguments(q)

    seen = asub.add_parser("seen", help="rows, documents and tokens consumed; per shard, source, file and language")
    common(seen)
    seen.add_argument("--out", help="write one row per document seen to FILE.parquet or FILE.jsonl")
    seen.add_argument("--samples-out", help="write one row per consumed sample (index, step, rank, shard, row) to .parquet/.jsonl")
    seen.set_defaults(handler=_seen)

    doc = asub.add_parser("doc", help="was this document seen, at which steps and ranks, and where it came from")
    common(doc)
    doc.add_argument("doc_id")
    doc.set_defaults(handler=_doc)

    steps = asub.add_parser("steps", help="the documents a window of steps trained on (and skipped), with the losses")
    common(steps)
    steps.add_argument("--out", help="write one row per document of the window to FILE.parquet or FILE.jsonl")
    steps.add_argument("--samples-out", help="write one row per (sample, document) to FILE.parquet or FILE.jsonl")
    steps.set_defaults(handler=_steps)

    leak = asub.add_parser("leak", help="did any item of an eval set occur in the text the model saw")
    common(leak)
    leak.add_argument("--eval", required=True, dest="eval_file", help="eval set: JSONL (text fields), Parquet or plain text")
    leak.add_argument("--field", action="append", dest="fields",
                      help="JSONL/Parquet field(s) joined into an item's text (repeatable; default: text)")
    leak.add_argument("--id-field", help="JSONL/Parquet field naming an item (default: its number in the file)")
    leak.add_argument("--format", choices=("jsonl", "parquet", "text"), help="default: from the file name")
    leak.add_argument("--n", type=int, default=None,
                      help="n-gram length (default: the dataset's decontaminate.n, else 13)")
    leak.add_argument("--min-matches", type=int, default=None,
                      help="matching n-grams needed to call an item found; an item with fewer needs all of them "
                           "(default: the dataset's decontaminate.min_matches, else 1)")
    leak.add_argument("--out", help="write one row per (item, document) match to FILE.parquet or FILE.jsonl")
    leak.set_defaults(handler=_leak)


def _open(args):
    from gristmill.audit.checkpoint import open_manifest, read_checkpoint, verify_files
    from gristmill.audit.consumed import consumed, parse_steps

    options = storage_options(args)  # the checkpoint's store and the data's
    ckpt = read_checkpoint(args.checkpoint, options)
    if args.verify_checkpoint:
        verify_files(ckpt)
    from gristmill.manifests.mixture import is_mixture

    from gristmill.audit.mixture import consumed_components

    published = open_manifest(ckpt, args.manifest, options)
    steps = parse_steps(args.steps, ckpt)
    if is_mixture(published):  # one Consumed per component (audit/mixture.py)
        return ckpt, published, steps, consumed_components(published, ckpt, steps)
    return ckpt, published, steps, consumed(published.manifest, ckpt, steps)


def _seen(args) -> int:
    from gristmill.audit.output import check_output_path, write_table
    from gristmill.audit.seen import audit_seen, consumed_table

    check_output_path(args.out)
    check_output_path(args.samples_out)
    from gristmill.manifests.mixture import is_mixture

    from gristmill.audit.mixture import audit_seen_mixture, consumed_table_mixture

    ckpt, published, steps, used = _open(args)
    mixed = is_mixture(published)
    report = audit_seen_mixture(published, used, steps) if mixed else audit_seen(published, used, steps)
    if args.out:
        write_table(report.documents, args.out)
    if args.samples_out:
        write_table(consumed_table_mixture(published, used) if mixed else consumed_table(used, published.manifest),
                    args.samples_out)
    if args.json:
        json.dump(report.summary, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    s = report.summary
    print(f"checkpoint   {ckpt.path} (step {ckpt.step}, world size {ckpt.world_size}, global batch {ckpt.global_batch}, "
          f"seed {ckpt.seed}, order {ckpt.order})")
    kind = "mixture " if mixed else "manifest"
    print(f"{kind}     {s['dataset']} v{s['version']} {s['manifest_sha256']} (hash matches the checkpoint)")
    for name, c in s.get("by_component", {}).items():
        print(f"  {name:<20} {c['samples']:>10,} samples ({c['share']:.2%}; weight {c['parts']}/{c['period']})  "
              f"{c['tokens_seen']:>14,} tokens ({c['rows_seen']:,} of {c['rows']:,} rows)  {c['dataset']} v{c['version']}")
    print(f"steps        {s['steps'][0]}:{s['steps'][1]}  {s['samples']:,} samples, {s['rows_seen']:,} distinct rows "
          f"({s['rows_seen_more_than_once']:,} more than once)")
    print(f"tokens       {s['tokens_seen']:,} distinct, {s['token_exposures']:,} with repeats")
    print(f"documents    {s['documents_seen']:,} seen: {s['documents_fully_seen']:,} fully, {s['documents_partly_seen']:,} partly")
    for title, key in (("by shard", "by_shard"), ("by source", "by_source"), ("by file", "by_file"), ("by language", "by_lang")):
        print(title)
        entries = list(s[key].items())
        for name, e in entries[:MAX_LINES]:
            if key == "by_shard":
                print(f"  {name:<40} {e['rows_seen']:>10,} of {e['rows']:,} rows, {e['samples']:,} samples")
            else:
                print(f"  {name:<40} {e['documents']:>10,} docs ({e['fully_seen']:,} fully) {e['tokens_seen']:>14,} tokens")
        if len(entries) > MAX_LINES:
            print(f"  ... {len(entries) - MAX_LINES:,} more (--json has all of them)")
    for path in (args.out, args.samples_out):
        if path:
            print(f"wrote {path}")
    return 0


def _doc(args) -> int:
    from gristmill.manifests.mixture import is_mixture

    from gristmill.audit.doc import audit_doc
    from gristmill.audit.mixture import audit_doc_mixture

    from gristmill.audit.consumed import skipped

    ckpt, published, steps, used = _open(args)
    if is_mixture(published):
        answer = audit_doc_mixture(published, ckpt, used, args.doc_id)
    else:
        answer = audit_doc(published, ckpt, used, args.doc_id, skipped(published.manifest, ckpt, steps))
    if args.json:
        json.dump(answer, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0 if answer["seen"] else 1
    p = answer["provenance"]
    how = "fully" if answer["fully_seen"] else "partly" if answer["seen"] else "NOT"
    print(f"{answer['doc_id']}: {how} seen ({answer['tokens_seen']:,} of {answer['tokens']:,} tokens) "
          f"in steps {steps[0]}:{steps[1]} of {ckpt.path}")
    for o in answer["occurrences"][:MAX_LINES]:
        where = f"{o['component']}/{o['shard']}" if "component" in o else o["shard"]
        print(f"  step {o['step']:>8} rank {o['rank']:>4} index {o['index']:>12}  {where} row {o['row']} ({o['tokens']} tokens)")
    if len(answer["occurrences"]) > MAX_LINES:
        print(f"  ... {len(answer['occurrences']) - MAX_LINES:,} more (--json has all of them)")
    for o in answer.get("skipped", [])[:MAX_LINES]:
        print(f"  skipped at step {o['skipped_at_step']} ({o['kind']}: {o['reason']}): step {o['step']} index "
              f"{o['index']}  {o['shard']} row {o['row']} ({o['tokens']} tokens), not trained on")
    print(f"source       {p['source']} position {p['position']} lang {p['lang']}")
    if p.get("url"):
        print(f"url          {p['url']}")
    print(f"input file   sha256 {p['input_sha256']} ({p['input_bytes']} bytes)" if p["input_sha256"] else
          "input file   not listed in the manifest's inputs")
    print(f"dataset      {p['dataset']} v{p['version']} {p['manifest_sha256']}"
          + (f" (component {p['component']} of mixture {p['mixture']} {p['mixture_sha256']})" if "mixture" in p else ""))
    return 0 if answer["seen"] else 1


def _steps(args) -> int:
    from gristmill.audit.checkpoint import AuditError
    from gristmill.audit.output import check_output_path, write_table
    from gristmill.audit.steps import audit_steps

    if not args.steps:
        raise AuditError("audit steps: --steps A:B is required (the window to list, e.g. the steps around a spike)")
    check_output_path(args.out)
    check_output_path(args.samples_out)
    ckpt, published, steps, _ = _open(args)
    report = audit_steps(published, ckpt, steps)
    if args.out:
        write_table(report.documents, args.out)
    if args.samples_out:
        write_table(report.samples, args.samples_out)
    s = report.summary
    if args.json:
        # One line, by json's C encoder: a window holds 10^5 documents (indented, json.dump takes ~10x longer)
        sys.stdout.write(json.dumps({**s, "documents": report.documents.to_pylist()}, sort_keys=True, default=str) + "\n")
        return 0
    print(f"checkpoint   {ckpt.path} (step {ckpt.step}, global batch {ckpt.global_batch})")
    print(f"{'mixture ' if s['components'] else 'manifest'}     {s['dataset']} v{s['version']} {s['manifest_sha256']}"
          + (f" (components {', '.join(s['components'])}: documents named <component>/<doc_id>)" if s["components"] else ""))
    print(f"steps        {steps[0]}:{steps[1]}  {s['samples_trained']:,} samples trained, {s['samples_skipped']:,} "
          f"skipped, {s['documents']:,} documents")
    for e in s["losses"]:
        flags = (" (bad step: no update)" if e["skipped"] else "") + (" (before a rewind)" if e["rewound"] else "")
        print(f"  step {e['step']:>8}  loss {e['loss']:.4f}  grad_norm {e['grad_norm']:.4f}{flags}")
    for e in s["spikes"]:
        print(f"  SPIKE step {e['step']}: {e['metric']} {e['value']:.4g}, {e['z']:.1f} spreads above its mean "
              f"{e['mean']:.4g}; action {e['action']}")
    for e in s["skips"]:
        print(f"  skipped    samples [{e['start']}, {e['end']}) at step {e['step']} ({e['kind']}: {e['reason']})")
    print("documents (by first step in the window)")
    for d in report.documents.slice(0, MAX_LINES).to_pylist():
        why = f"  SKIPPED ({'; '.join(d['skipped'])})" if d["skipped"] else ""
        print(f"  steps {d['first_step']}:{d['last_step']} ranks {d['ranks']} micro {d['micro_batches']}  {d['doc_id']}  "
              f"{d['tokens']:,} tokens ({d['tokens_in_steps']:,} here), seen {d['seen_before']}x before{why}")
        print(f"      {d['source']}" + (f"  {d['url']}" if d.get("url") else "") + f"  lang {d['lang']}"
              + "".join(f"  {k} {d[k]}" for k in ("lang_score", "quality", "quality_score") if d.get(k) is not None))
    if report.documents.num_rows > MAX_LINES:
        print(f"  ... {report.documents.num_rows - MAX_LINES:,} more (--json or --out has all of them)")
    for path in (args.out, args.samples_out):
        if path:
            print(f"wrote {path}")
    return 0


def _leak(args) -> int:
    from gristmill.manifests.mixture import is_mixture

    from gristmill.audit.leak import audit_leak
    from gristmill.audit.mixture import audit_leak_mixture
    from gristmill.audit.output import check_output_path, write_table

    check_output_path(args.out)
    ckpt, published, steps, used = _open(args)
    report = (audit_leak_mixture if is_mixture(published) else audit_leak)(
        published, used, args.eval_file, fields=args.fields, n=args.n, min_matches=args.min_matches,
        id_field=args.id_field, fmt=args.format)
    if args.out:
        write_table(report.matches, args.out)
    if args.json:
        json.dump(report.summary, sys.stdout, indent=1, sort_keys=True)
        print()
        return 1 if report.summary["items_leaked"] else 0
    s = report.summary
    verdict = "LEAKED" if s["items_leaked"] else "clean"
    print(f"{verdict}: {s['items_leaked']} of {s['items']} items of {s['eval_file']} occur in "
          f"{s['documents_leaked']} documents seen in steps {steps[0]}:{steps[1]} ({s['documents_checked']:,} documents, "
          f"{s['tokens_checked']:,} tokens checked, {s['n']}-grams)")
    if isinstance(s["decontaminated_against"], dict):  # a mixture: per component
        for name, against in s["decontaminated_against"].items():
            if against:
                print(f"  (component {name} was decontaminated against this file, as eval set {against!r})")
    elif s["decontaminated_against"]:
        print(f"  (this file is the manifest's eval set {s['decontaminated_against']!r}: the dataset was decontaminated against it)")
    for row in report.matches.slice(0, MAX_LINES).to_pylist():
        where = f"{row['component']}/{row['doc_id']}" if "component" in row else row["doc_id"]
        print(f"  item {row['item']:>6} in {where}  steps {row['steps']}  ({row['ngrams']} matching n-grams)")
    if report.matches.num_rows > MAX_LINES:
        print(f"  ... {report.matches.num_rows - MAX_LINES:,} more (use --out)")
    if args.out:
        print(f"wrote {args.out}")
    return 1 if s["items_leaked"] else 0
