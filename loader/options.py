"""The Loader's typed sections: what it serves (``Sampling``), where it reads (``Source``), where it
keeps shards (``Caching``), how many threads (``Threads``) and what a batch holds (``Batches``).
Each is a frozen dataclass with the defaults a single-process run wants, so a caller names only
what differs::

    Loader(url, Sampling(seed=1, global_batch=64, rank=r, world_size=w), caching=Caching(dir="/nvme/gm"))
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from gristmill.errors import UsageError

from .order import DEFAULT_WINDOW_SHARDS

INT64 = "int64"  # Batches' default token_dtype, by name (torch.int64; np.int64 with numpy=True): no torch import here
DEFAULT_MAPPED_LIMIT = 256 << 20  # shard pages kept mapped per process (see ShardCache.bound_mapped_pages)


@dataclass(frozen=True)
class Sampling:
    """Which global sample indices each step serves (the pure order's inputs, loader/order.py) and
    this rank's slice of them. Step ``s`` covers ``[s*global_batch, (s+1)*global_batch)``."""

    split: str = "train"
    seed: int = 0
    global_batch: int = 32
    rank: int = 0
    world_size: int = 1
    order: str = "global"  # global | window | sequential
    window_shards: int = DEFAULT_WINDOW_SHARDS  # order="window": shards per window
    start_index: int = 0  # the first global index served (a resume sets it through load_state_dict)
    epochs: int | None = None  # None: endless

    def __post_init__(self):
        b, r, w = self.global_batch, self.rank, self.world_size
        check(b >= 1, f"global_batch must be >= 1, got {b}")
        check(w >= 1 and 0 <= r < w, f"rank {r} is outside world_size {w}")
        check(b % w == 0, f"global_batch {b} is not divisible by world_size {w}: every rank takes an equal slice")
        check(self.start_index >= 0, f"start_index must be >= 0, got {self.start_index}")
        check(self.epochs is None or self.epochs >= 1, f"epochs must be None (endless) or >= 1, got {self.epochs}")


@dataclass(frozen=True)
class Source:
    """How the manifest and shards are read from their store."""

    expected_sha256: str | None = None  # refuse a manifest with another hash
    storage_options: dict = field(default_factory=dict)  # fsspec options of the store
    retries: int = 5  # per manifest load and shard fetch (served: per step range, over the endpoints)
    backoff_s: float = 0.2  # doubled after each failed try
    # `gristmill serve` endpoints (docs/service.md): when set, batches come from the service, not from
    # a local cache; grpc://host:port or grpc+tls://host:port, tried in turn on a failure
    service: tuple[str, ...] = ()
    service_token: str | None = None  # bearer token; default: service_token_file, else $GRISTMILL_SERVE_TOKEN
    service_token_file: str | None = None
    service_tls_root: str | None = None  # PEM file of the CA that signed the servers' certificates (grpc+tls)
    service_tls_cert: str | None = None  # PEM certificate and key of this client, for a server with mutual TLS
    service_tls_key: str | None = None
    service_timeout_s: float = 60.0  # deadline of one request (a range of steps) before it is retried elsewhere
    # how long a range of steps is retried (every endpoint in turn, exponential backoff with jitter) before the
    # loader fails: long enough for a server restart, a rolling update or a node drain to be invisible
    service_deadline_s: float = 120.0
    # steps asked for in one request (two requests in flight; threads.prefetch does not apply to a served
    # loader); lowered to a reply of at most 16 MiB (loader/service/client.py RANGE_BYTES), the protocol's
    # row bound and a server's default reply bound (256 MiB)
    service_steps_per_request: int = 64

    def __post_init__(self):
        # one endpoint may be given as a string
        object.__setattr__(self, "service", (self.service,) if isinstance(self.service, str) else tuple(self.service))
        for u in self.service:
            check(isinstance(u, str) and u.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")),
                  f"service: expected grpc://HOST:PORT or grpc+tls://HOST:PORT endpoints, got {u!r}")
        check(self.service_timeout_s > 0, f"service_timeout_s must be > 0, got {self.service_timeout_s}")
        check(self.service_deadline_s > 0, f"service_deadline_s must be > 0, got {self.service_deadline_s}")
        check(isinstance(self.service_steps_per_request, int) and 1 <= self.service_steps_per_request <= 1024,
              f"service_steps_per_request must be 1..1024, got {self.service_steps_per_request!r}")


@dataclass(frozen=True)
class Caching:
    """The node-local shard cache (loader/cache.py)."""

    dir: str | None = None  # default: $GRISTMILL_CACHE_DIR or ~/.cache/gristmill/shards
    limit_bytes: int | None = None  # None: no limit (no eviction)
    mapped_limit_bytes: int | None = DEFAULT_MAPPED_LIMIT  # None: no limit on mapped shard pages

    def __post_init__(self):
        check(self.mapped_limit_bytes is None or self.mapped_limit_bytes > 0,
              f"mapped_limit_bytes must be None (no limit) or > 0, got {self.mapped_limit_bytes}")


@dataclass(frozen=True)
class Threads:
    prefetch: int = 4  # steps assembled ahead of the consumer
    workers: int = 2  # batch-assembly threads; 0: in the consumer's thread
    fetch_workers: int = 8  # download threads

    def __post_init__(self):
        check(self.prefetch >= 1 and self.workers >= 0 and self.fetch_workers >= 1,
              f"prefetch and fetch_workers must be >= 1 and workers >= 0, got {self.prefetch}, {self.fetch_workers}, "
              f"{self.workers}")


@dataclass(frozen=True)
class Batches:
    """What a batch holds besides ``tokens`` and ``indices``, and as what."""

    # a torch.dtype (numpy=True: a numpy dtype); None: the shards' own dtype; INT64 (the default): int64
    token_dtype: object = INT64
    pin_memory: bool | None = None  # None: when CUDA is available (never with numpy=True)
    documents: bool = False  # also each row's document boundaries (position_ids, cu_seqlens)
    # numpy arrays instead of torch tensors, and torch never imported: what `gristmill serve` assembles
    numpy: bool = False

    def __post_init__(self):
        check(not (self.numpy and self.pin_memory), "pin_memory=True needs torch tensors; it cannot go with numpy=True")


def check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


SECTIONS = {"sampling": Sampling, "source": Source, "caching": Caching, "threads": Threads, "batches": Batches}
# the flat names of sections' fields where a flat option list is the documented interface
# (GristmillDataset's loader_options, `gristmill loader bench`'s flags)
_FLAT = {"cache_dir": ("caching", "dir"), "cache_limit_bytes": ("caching", "limit_bytes"),
         "mapped_limit_bytes": ("caching", "mapped_limit_bytes")}


def sections(**options) -> dict:
    """Loader keyword arguments (``sampling=``, ``source=``, ...) from flat option names (``seed``,
    ``cache_dir``, ``workers``, ...); an unknown name is a TypeError, as a bad keyword would be."""
    by_section: dict[str, dict] = {name: {} for name in SECTIONS}
    owner = {f.name: (name, f.name) for name, cls in SECTIONS.items() for f in fields(cls)
             if f.name not in ("dir", "limit_bytes")} | _FLAT
    for key, value in options.items():
        if key not in owner:
            raise TypeError(f"unknown Loader option {key!r}; options: {', '.join(sorted(owner))}")
        name, attr = owner[key]
        by_section[name][attr] = value
    return {name: SECTIONS[name](**kw) for name, kw in by_section.items() if kw}
