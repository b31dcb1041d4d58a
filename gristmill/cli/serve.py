"""``gristmill serve``: serve training batches over Arrow Flight (docs/service.md)."""
from __future__ import annotations

import argparse

from .common import add_storage_option_arguments


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve training batches to remote loaders over Arrow Flight (docs/service.md)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("urls", nargs="+", metavar="STORE_OR_MANIFEST_URL",
                   help="manifest store roots, dataset or mixture URLs (<root>/<name>) or versions (<root>/<name>/v<N>)")
    p.add_argument("--listen", default="127.0.0.1:8815", metavar="HOST:PORT",
                   help="address to listen on (port 0: any free port, printed at start)")
    p.add_argument("--token-file", metavar="F", help="file holding the bearer token clients must send "
                                                     "(else $GRISTMILL_SERVE_TOKEN); required beyond loopback")
    p.add_argument("--tls-cert", metavar="F", help="PEM certificate chain: serve grpc+tls")
    p.add_argument("--tls-key", metavar="F", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", metavar="F", help="PEM CA: mutual TLS, clients must present a certificate it signed")
    p.add_argument("--cache-dir", help="node-local shard cache (default: $GRISTMILL_CACHE_DIR or ~/.cache/gristmill/shards)")
    p.add_argument("--cache-limit-bytes", type=int)
    add_storage_option_arguments(p)
    p.add_argument("--max-open", type=int, default=16, help="(manifest, sampling) entries kept open (LRU)")
    p.add_argument("--max-streams", type=int, default=512, help="streams served at once, in all")
    p.add_argument("--max-streams-per-client", type=int, default=256,
                   help="streams at once per client identity (its gristmill-client id, else TLS peer, else host)")
    p.add_argument("--max-inflight-bytes", type=int, default=512 << 20,
                   help="reply bytes assembled and not yet read, in all (default 512 MiB)")
    p.add_argument("--max-inflight-bytes-per-client", type=int, default=256 << 20,
                   help="reply bytes assembled and not yet read, per client identity (default 256 MiB)")
    p.add_argument("--admission-wait-s", type=float, default=10.0,
                   help="a stream past a bound waits this long for room, then is refused as busy (the client retries)")
    p.add_argument("--stream-idle-s", type=float, default=30.0,
                   help="a stream whose reader took nothing for this long is cancelled and its slot freed")
    p.add_argument("--max-reply-bytes", type=int, default=256 << 20,
                   help="one request's reply at most this many bytes (default 256 MiB); a larger one is refused")
    p.add_argument("--rescan-interval-s", type=float, default=2.0,
                   help="an unknown manifest hash rescans the stores at most this often")
    p.set_defaults(handler=_serve)


def _read(path: str | None, flag: str) -> bytes | None:
    """The bytes of a file named on the command line, or a one-line error naming the flag."""
    from gristmill.errors import UsageError

    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None


def _serve(args) -> int:
    import os
    import signal
    import threading

    from gristmill.errors import UsageError
    from gristmill.loader.service.config import ServeConfig
    from gristmill.loader.service.protocol import TOKEN_ENV

    from .common import storage_options

    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--listen: expected HOST:PORT, got {args.listen!r}")
    token = _read(args.token_file, "--token-file").decode().strip() if args.token_file else os.environ.get(TOKEN_ENV)
    if args.token_file and not token:
        raise UsageError(f"--token-file {args.token_file} is empty")
    cfg = ServeConfig(tuple(args.urls), host=host.strip("[]"), port=int(port), token=token or None,
                      tls_cert=_read(args.tls_cert, "--tls-cert"), tls_key=_read(args.tls_key, "--tls-key"),
                      tls_client_ca=_read(args.tls_client_ca, "--tls-client-ca"),
                      cache_dir=args.cache_dir, cache_limit_bytes=args.cache_limit_bytes, max_open=args.max_open,
                      storage_options=storage_options(args),
                      max_streams=args.max_streams, max_streams_per_client=args.max_streams_per_client,
                      max_inflight_bytes=args.max_inflight_bytes,
                      max_inflight_bytes_per_client=args.max_inflight_bytes_per_client,
                      admission_wait_s=args.admission_wait_s, stream_idle_s=args.stream_idle_s,
                      rescan_interval_s=args.rescan_interval_s, max_reply_bytes=args.max_reply_bytes)
    from gristmill.loader.service.server import GristmillServer  # grpc, pyarrow and the loader: after the checks

    server = GristmillServer(cfg)
    stop = threading.Event()
    received: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: (received.append(signum), stop.set()))
    print(f"gristmill serve: listening on {cfg.scheme}://{cfg.host}:{server.port} ({len(server.catalog.by_sha)} manifests; "
          f"token {'required' if cfg.token else 'not required'})", flush=True)
    while not stop.wait(0.5):
        pass
    print(f"gristmill serve: {signal.Signals(received[0]).name}, shutting down", flush=True)
    server.shutdown()
    return 0
