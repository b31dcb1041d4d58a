"""``gristmill prepare JOB.yaml`` and ``gristmill demo-corpus OUT_DIR``."""
from __future__ import annotations

from gristmill import config


def register(sub) -> None:
    p = sub.add_parser("prepare", help="raw corpora -> a published, content-hashed token dataset (Ray tasks)")
    p.add_argument("job", help="job YAML file (see docs/pipeline.md)")
    p.add_argument("--address", help="Ray cluster address (default: embedded local Ray, or RAY_ADDRESS under `ray job submit`)")
    p.add_argument("--quiet", action="store_true", help="no per-stage progress lines")
    config.add_arguments(p)
    p.set_defaults(handler=_prepare)
    d = sub.add_parser("demo-corpus", help="write the small deterministic multilingual demo corpus with planted ground truth")
    d.add_argument("out_dir")
    d.add_argument("--scale", type=int, default=1, help="corpus size multiplier (default 1: a few MB)")
    d.set_defaults(handler=_demo_corpus)


def _prepare(args) -> int:
    from .config import load_job

    job = load_job(args.job, args.overrides)
    if args.print_config:
        print(config.dump_yaml(job), end="")
        return 0
    from .executor import prepare
    from .stats import format_table

    result = prepare(job, address=args.address, quiet=args.quiet)
    print(format_table(result.report))
    return 0 if result.report["accounting"]["balanced"] else 1


def _demo_corpus(args) -> int:
    from .demo_corpus import write_demo_corpus

    summary = write_demo_corpus(args.out_dir, scale=args.scale)
    print(f"wrote {summary['files']} corpus files ({summary['bytes']:,} bytes), evals/ and truth/ to {args.out_dir}")
    return 0
