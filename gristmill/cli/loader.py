"""``gristmill loader bench``: input wait of a simulated trainer, cold and warm cache, or through ``gristmill serve``."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("loader", help="the training data loader")
    lsub = p.add_subparsers(dest="loader_command", required=True, metavar="ACTION")
    b = lsub.add_parser("bench", help="input wait of a simulated trainer reading through a simulated remote store "
                                      "(or from `gristmill serve` endpoints: --service)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("url", nargs="?",
                   help="dataset version or mixture (gristmill mix): <root>/<name>[/v<N>] (any fsspec URL); "
                        "with --service also a name or sha256 the service resolves")
    b.add_argument("--synthetic", action="store_true", help="build a throwaway random-token dataset instead of a URL")
    b.add_argument("--sequences", type=int, default=4096, help="--synthetic: sequences in the dataset")
    b.add_argument("--seq-len", type=int, default=2048, help="--synthetic: tokens per sequence")
    b.add_argument("--shard-rows", type=int, default=512, help="--synthetic: sequences per shard")
    b.add_argument("--order", choices=("global", "window", "sequential"), default="window")
    b.add_argument("--window-shards", type=int, default=8)
    b.add_argument("--global-batch", type=int, default=32)
    b.add_argument("--steps", type=int, default=50, help="steps per pass (cold, then warm)")
    b.add_argument("--step-ms", type=float, default=100.0, help="simulated compute time per step")
    b.add_argument("--latency-ms", type=float, default=50.0, help="simulated per-request latency of the store")
    b.add_argument("--bandwidth-mbps", type=float, default=1000.0, help="simulated store bandwidth, MB/s (0 = unlimited)")
    b.add_argument("--prefetch", type=int, default=4)
    b.add_argument("--workers", type=int, default=2, help="batch-assembly threads")
    b.add_argument("--fetch-workers", type=int, default=8, help="download threads")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--ranks", type=int, default=1,
                   help="run each pass as N processes, ranks 0..N-1 of one job sharing one cache (as a node's "
                        "ranks do), all at once: every rank's own wait is reported")
    b.add_argument("--cache-dir", help="put the bench's temporary cache under this directory (e.g. the NVMe); "
                                       "removed afterwards, an existing cache is never touched")
    b.add_argument("--cache-limit-bytes", type=int)
    b.add_argument("--service", nargs="+", metavar="URL",
                   help="read the batches from these `gristmill serve` endpoints (grpc://HOST:PORT, grpc+tls://...) "
                        "instead of a simulated store: two passes, first and again (the servers' caches as the "
                        "first left them); the store and cache flags do not apply")
    b.add_argument("--service-token-file", metavar="F", help="--service: bearer token file (else $GRISTMILL_SERVE_TOKEN)")
    b.add_argument("--service-tls-root", metavar="F", help="--service: PEM CA of the servers' certificates (grpc+tls)")
    b.add_argument("--json", metavar="PATH", help="also write the results as JSON here ('-' for stdout only)")
    b.set_defaults(handler=_bench)


def _bench(args) -> int:
    import shutil
    import tempfile

    from gristmill.errors import UsageError
    from gristmill.loader.bench import cold_and_warm, served_passes, table, to_json
    from gristmill.manifests.synthetic import build_synthetic, even_shards

    if bool(args.url) == bool(args.synthetic):
        raise UsageError("give either a dataset URL or --synthetic")
    if args.ranks < 1 or args.global_batch % args.ranks:
        raise UsageError(f"--ranks {args.ranks}: expected a positive divisor of --global-batch {args.global_batch}")
    if args.service and args.ranks > 1:
        raise UsageError("--ranks applies to the simulated store; with --service run one bench per client")
    if args.service and args.synthetic:
        raise UsageError("--service reads a dataset the servers publish: give its URL, name or sha256, not --synthetic")
    tmp = None
    try:
        url = args.url
        if args.synthetic:
            tmp = tempfile.mkdtemp(prefix="gristmill-bench-data-")
            url = build_synthetic(tmp, seq_len=args.seq_len, shard_rows=even_shards(args.sequences, args.shard_rows),
                                  val_rows=(), vocab_size=32000, tokens="random", seed=args.seed).url
        config = {k: v for k, v in vars(args).items() if k not in ("handler", "command", "loader_command", "verbose")}
        sampling = dict(order=args.order, window_shards=args.window_shards, global_batch=args.global_batch,
                        prefetch=args.prefetch, seed=args.seed)
        if args.service:
            results = served_passes(url, tuple(args.service), steps=args.steps, step_s=args.step_ms / 1e3,
                                    service_token_file=args.service_token_file,
                                    service_tls_root=args.service_tls_root, **sampling)
        else:
            results = cold_and_warm(
                url, steps=args.steps, step_s=args.step_ms / 1e3, latency_s=args.latency_ms / 1e3,
                bandwidth_bps=args.bandwidth_mbps * 1e6 or None, cache_dir=args.cache_dir, workers=args.workers,
                fetch_workers=args.fetch_workers, cache_limit_bytes=args.cache_limit_bytes, ranks=args.ranks,
                **sampling)
        if args.json != "-":
            print(table(results))
        if args.json:
            text = to_json(results, config)
            if args.json == "-":
                print(text)
            else:
                with open(args.json, "w") as f:
                    f.write(text + "\n")
        return 0
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
