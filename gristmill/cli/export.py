"""``gristmill export megatron|parquet|arrow-stream``: a published dataset version in other tools' formats (manifests/export.py)."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("export", help="write a dataset version as Megatron-LM .bin/.idx or as Parquet, verified first")
    esub = p.add_subparsers(dest="export_command", required=True, metavar="FORMAT")
    meg = esub.add_parser("megatron", help="Megatron-LM indexed dataset: OUT_PREFIX.bin + OUT_PREFIX.idx, one "
                          "sequence per document (+ OUT_PREFIX.gristmill.json: the manifest hash)")
    meg.add_argument("url", metavar="DATASET_URL", help="dataset version: <root>/<dataset>[/v<N>]")
    meg.add_argument("out_prefix", metavar="OUT_PREFIX", help="local path prefix of the .bin/.idx pair")
    meg.add_argument("--split", default="train", choices=("train", "validation"))
    meg.set_defaults(handler=_megatron)
    views = []
    for fmt, what in (("parquet", "a Parquet file per token shard (shard, row, tokens) for DuckDB and other "
                                  "Parquet readers"),
                      ("arrow-stream", "an Arrow streaming file per token shard (shard, row, tokens) for Hugging "
                                       "Face datasets' Dataset.from_file")):
        v = esub.add_parser(fmt, help=f"{what} (+ OUT_DIR/gristmill.json: the manifest hash)")
        v.add_argument("url", metavar="DATASET_URL")
        v.add_argument("out_dir", metavar="OUT_DIR")
        v.add_argument("--split", action="append", choices=("train", "validation"),
                       help="split(s) to export (repeatable; default both)")
        v.set_defaults(handler=_view, format=fmt)
        views.append(v)
    for q in (meg, *views):
        q.add_argument("--sha256", help="require the manifest to hash to this")
        q.add_argument("--overwrite", action="store_true", help="replace existing output files")


def _megatron(args) -> int:
    from gristmill.manifests.export import export_megatron

    record = export_megatron(args.url, args.out_prefix, split=args.split, expected_sha256=args.sha256,
                             overwrite=args.overwrite)
    print(json.dumps({k: record[k] for k in ("manifest_sha256", "split", "sequences", "tokens", "files")}, indent=2))
    return 0


def _view(args) -> int:
    from gristmill.manifests.export import export_view

    record = export_view(args.url, args.out_dir, args.format, splits=tuple(args.split or ("train", "validation")),
                         expected_sha256=args.sha256, overwrite=args.overwrite)
    print(f"{len(record['files'])} {args.format} files under {args.out_dir} from manifest {record['manifest_sha256']}")
    return 0
