"""``ServeConfig``: what ``gristmill serve`` is started with, checked whole before anything heavy is imported.

Apart from server.py (which re-exports it) so that the command refuses a bad start (no token beyond
loopback, half a TLS pair) in the time it takes to parse its flags, not after importing grpc, pyarrow
and the loader (seconds)."""
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
    # Admission (loader/service/admission.py): streams and reply bytes in flight, in all and per client identity.
    # A stream holds one assembled chunk (<= 1 MiB) until read; a rank keeps 2 ranges in flight, so the
    # defaults serve 64 ranks on each of 4 hosts (or 128 on one) without a refusal.
    max_streams: int = 512
    max_streams_per_client: int = 256
    max_inflight_bytes: int = 512 << 20
    max_inflight_bytes_per_client: int = 256 << 20
    admission_wait_s: float = 10.0  # a stream past a bound waits this long for room before it is refused as busy
    stream_idle_s: float = 30.0  # a stream whose reader took nothing for this long is cancelled, its slot freed
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
        if self.token is not None and not self.token.strip():
            raise UsageError(f"the token (--token-file or ${TOKEN_ENV}) is empty or whitespace: give a real token")
        if self.token is not None and self.token != self.token.strip():
            raise UsageError(f"the token (--token-file or ${TOKEN_ENV}) starts or ends with whitespace: strip it")
        if min(self.max_open, self.max_streams, self.max_streams_per_client, self.max_inflight_bytes,
               self.max_inflight_bytes_per_client) < 1:
            raise UsageError("--max-open, --max-streams, --max-streams-per-client, --max-inflight-bytes and "
                             "--max-inflight-bytes-per-client must be >= 1")
        if self.admission_wait_s < 0 or self.stream_idle_s <= 0:
            raise UsageError("--admission-wait-s must be >= 0 and --stream-idle-s > 0")
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
