"""``gristmill demo-corpus OUT_DIR``: the small deterministic demo corpus with its planted ground truth."""
from __future__ import annotations


def register(sub) -> None:
    d = sub.add_parser("demo-corpus", help="write the small deterministic multilingual demo corpus with planted ground truth")
    d.add_argument("out_dir")
    d.add_argument("--scale", type=int, default=1, help="corpus size multiplier (default 1: a few MB)")
    d.set_defaults(handler=_demo_corpus)


def _demo_corpus(args) -> int:
    from gristmill.pipeline.demo_corpus import write_demo_corpus

    summary = write_demo_corpus(args.out_dir, scale=args.scale)
    print(f"wrote {summary['files']} corpus files ({summary['bytes']:,} bytes), evals/ and truth/ to {args.out_dir}")
    return 0
