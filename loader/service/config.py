"""``ServeConfig``: what ``gristmill serve`` is started with, checked whole before anything heavy is imported.

Apart from server.py (which re-exports it) so that the command refuses a bad start (no token beyond
loopback, half a TLS pair) in the time it takes to parse its flags, not after importing the loader
and torch (seconds)."""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from gristmill.errors import UsageError

from .protocol import DEFAULT_MAX_REPLY_BYTES, TOKEN_ENV


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``gristmill serve`` is started with (the command maps its flags onto this)."""

    urls: tuple[str, ...]  # manifest store roots, dataset / mixture URLs, or version URLs
    host: str = "127.0.0.1"
    port: int = 8815  # 0: any free port (``GristmillServer.port`` says which)
    token: str | None = None  # bearer token every call must carry; required beyond loopback
    tls_cert: bytes | None = None  # PEM certificate chain and key: TLS (grpc+tls://)
    tls_key: bytes | None = None
    tls_client_ca: bytes | None = None  # PEM CA: mutual TLS, a client must present a certificate it signed
    cache_dir: str | None = None  # the node-local shard cache (default: the Loader's)
    cache_limit_bytes: int | None = None
    storage_options: dict = field(default_factory=dict)  # fsspec options of the stores
    max_open: int = 16  # (manifest, sampling) entries kept open (LRU)
    max_streams: int = 64  # streams served at once
    max_streams_per_client: int = 8  # streams at once per client host
    rescan_interval_s: float = 2.0  # an unknown hash rescans the stores at most this often
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES  # one request's reply (all its steps) at most this many bytes
    session_idle_s: float = 60.0  # a client session idle this long is logged as ended, with its totals
    refusal_log_interval_s: float = 10.0  # at most one refusal line per client host this often

    def __post_init__(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise UsageError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise UsageError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if not self.token and not is_loopback(self.host):
            raise UsageError(f"refusing to listen on {self.host} without a token: anyone who reaches it could read "
                             f"the data; give --token-file or ${TOKEN_ENV}, or listen on 127.0.0.1")
        if self.max_open < 1 or self.max_streams < 1 or self.max_streams_per_client < 1:
            raise UsageError("max_open, max_streams and max_streams_per_client must be >= 1")
        if self.max_reply_bytes < 1:
            raise UsageError(f"max_reply_bytes must be >= 1, got {self.max_reply_bytes}")

    @property
    def scheme(self) -> str:
        return "grpc+tls" if self.tls_cert else "grpc"

    @property
    def location(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (an unresolvable name is not)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
