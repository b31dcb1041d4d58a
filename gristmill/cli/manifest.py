"""``gristmill manifest show|verify|list``."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("manifest", help="inspect and verify published dataset versions")
    msub = p.add_subparsers(dest="manifest_command", required=True, metavar="ACTION")
    show = msub.add_parser("show", help="print a manifest summary with its stage statistics as a table (--json: the whole manifest, machine-readable)")
    show.add_argument("url", help="dataset version or mixture: <root>/<name>[/v<N>[/manifest.json]]")
    show.add_argument("--json", action="store_true", help="print the full manifest JSON")
    show.set_defaults(handler=_show)
    verify = msub.add_parser("verify", help="check every pinned file against the manifest: hashes, sizes, "
                            "row counts, schemas, token ids (a full read)")
    verify.add_argument("url")
    verify.add_argument("--sha256", help="also require the manifest itself to hash to this")
    verify.set_defaults(handler=_verify)
    ls = msub.add_parser("list", help="list datasets and versions under a store root")
    ls.add_argument("root", help="fsspec URL of the store root")
    ls.add_argument("dataset", nargs="?")
    ls.set_defaults(handler=_list)


def _show(args) -> int:
    from gristmill.manifests.mixture import MixtureManifest, load_either

    pub = load_either(args.url)
    m = pub.manifest
    if args.json:
        print(m.to_json(), end="")
        return 0
    if isinstance(m, MixtureManifest):
        return _show_mixture(pub)
    print(f"dataset      {m.dataset} v{m.version}  ({pub.url})")
    print(f"sha256       {m.sha256}")
    print(f"created      {m.created_at}   code {m.code_version}")
    print(f"tokenizer    vocab {m.tokenizer.vocab_size}, eos {m.tokenizer.eos_id}, sha256 {m.tokenizer.sha256[:16]}…")
    print(f"sequences    seq_len {m.seq_len} (+1 label token per row), {m.token_dtype}")
    for split in ("train", "validation"):
        shards = m.shards_of(split)
        print(f"{split:<12} {len(shards)} shards, {sum(s.rows for s in shards):,} rows, "
              f"{sum(s.tokens for s in shards):,} tokens, {sum(s.bytes for s in shards):,} bytes")
    print(f"inputs       {len(m.inputs)} files, {sum(i.bytes for i in m.inputs):,} bytes")
    if m.eval_sets:
        print("eval sets    " + ", ".join(f"{e.name} ({e.items} items, {e.sha256[:12]}…)" for e in m.eval_sets))
    if m.stats:
        from gristmill.manifests.stats_table import format_stats

        print("stages")
        print(format_stats(m.stats))
    return 0


def _show_mixture(pub) -> int:
    from .mix import component_lines

    m = pub.manifest
    print(f"mixture      {m.name} v{m.version}  ({pub.url})")
    print(f"sha256       {m.sha256}")
    print(f"created      {m.created_at}   code {m.code_version}")
    print(f"tokenizer    vocab {m.tokenizer.vocab_size}, eos {m.tokenizer.eos_id}, sha256 {m.tokenizer.sha256[:16]}…")
    print(f"sequences    seq_len {m.seq_len} (+1 label token per row), {m.token_dtype}")
    print(f"components   {len(m.components)}, interleaved in periods of {m.period} samples")
    for line in component_lines(m):
        print(line)
    return 0


def _verify(args) -> int:
    from gristmill.manifests.store import load_manifest
    from gristmill.manifests.verify import verify_published

    pub = load_manifest(args.url, expected_sha256=args.sha256)
    problems = verify_published(pub)
    n = len(pub.manifest.shards) + 2
    if problems:
        for p in problems:
            print(f"FAILED {p}")
        print(f"{len(problems)} of {n} pinned files differ from what manifest {pub.manifest.sha256} states")
        return 1
    print(f"OK: all {n} pinned files match manifest {pub.manifest.sha256} (hashes, sizes, row counts, schemas, "
          f"token ids < vocab_size)")
    return 0


def _list(args) -> int:
    from gristmill.manifests.store import ManifestStore

    store = ManifestStore(args.root)
    for ds in [args.dataset] if args.dataset else store.datasets():
        versions = store.versions(ds)
        latest = store.latest(ds) if versions else None
        for v in versions:
            m = store.load(ds, v).manifest
            mark = "  (latest)" if v == latest else ""
            print(f"{ds}\tv{v}\t{m.sha256}\t{m.created_at}\t{sum(s.rows for s in m.shards)} rows{mark}")
    return 0
