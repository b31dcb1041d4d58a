"""``gristmill serve``: a stateless Arrow Flight server of training batches (docs/service.md).

Every request (loader/service/protocol.py) names everything a batch depends on, so the server
keeps no per-client state and any replica answers any request. Per (manifest, split, seed,
order, window_shards, documents) it keeps one :class:`~gristmill.loader.Loader` (its order, its
document boundaries and its view of the node-local ``ShardCache``, verified downloads and
eviction included) in an LRU of ``max_open`` entries, and answers rank ``r``'s step ``s`` with
``Loader.rows_at_many`` (the one assembly of a step; a request's steps planned in one vectorised
call, up to ``ASSEMBLE_BYTES`` and ``ASSEMBLE_ROWS`` of steps assembled at a time when gRPC asks for
the next record batch, each step sent as a zero-copy slice), in the shards' own token dtype.

Bounds: at most ``max_streams`` streams at once, ``max_streams_per_client`` per client host;
a stream past either is refused at once (``FlightUnavailableError``: the client retries, on
another endpoint first). A request whose reply would exceed ``max_reply_bytes`` is refused once its
manifest is known (``bad request``: ask fewer steps a request). A request is checked before any work; every refusal is one line and
the server keeps serving the others. A client that disconnects mid-stream frees its slot when
gRPC drops the stream.

Logging: one INFO line when a client session (client host, manifest, split, rank/world) is first
seen and one when it has been idle ``session_idle_s`` or the server stops, with its totals
(streams, steps, bytes, errors); one DEBUG line per stream. Refusals (bad request, unknown
manifest, authentication, busy) are counted in ``stats`` by kind and logged at WARNING, at most one
line per client host per ``refusal_log_interval_s`` (the lines left out are counted in the next).

Security (:class:`ServeConfig`): a bearer token checked by server middleware on every call
(constant-time compare); TLS from certificate and key files, optionally mutual TLS; listening
beyond the loopback interface without a token is refused at start.
"""
from __future__ import annotations

import collections
import ctypes
import hmac
import json
import logging
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from gristmill.errors import GristmillError

from ..loader import PLAN_ROWS, Loader
from ..options import Batches, Caching, Sampling, Threads
from .catalog import Catalog, UnknownManifest
from .config import ServeConfig, is_loopback  # noqa: F401  (ServeConfig lives beside, without torch: see config.py)
from .protocol import (META_REQUEST, META_SHA, SHA256, TOKEN_ENV, ProtocolError, Request,
                       json_object, one_line, reply_bytes, step_bytes)

log = logging.getLogger(__name__)

LATENCIES_KEPT = 4096  # per-step assembly latencies the stats' percentiles are computed over
ASSEMBLE_BYTES = 1 << 20  # a stream assembles at most this many bytes of steps at once (at least one step),
ASSEMBLE_ROWS = 256  # and at most this many rows (its pins: as many shards at most, or one step's)
TRIM_AFTER_BYTES = 16 << 20  # a stream that sent this much returns the freed heap to the system when it ends


class _BearerAuth(flight.ServerMiddlewareFactory):
    """Every call must carry ``authorization: Bearer <token>``."""

    def __init__(self, token: str, on_refusal=None):
        self.token = token.encode()
        self.on_refusal = on_refusal or (lambda client, kind, message: None)

    def start_call(self, info, headers):
        values = headers.get("authorization") or headers.get("Authorization") or []
        got = values[0] if values else ""
        got = got.encode() if isinstance(got, str) else bytes(got)
        if not got:
            message = ("gristmill serve: no bearer token (give the client service_token, service_token_file or "
                       f"${TOKEN_ENV})")
        elif not (got.startswith(b"Bearer ") and hmac.compare_digest(got[7:], self.token)):
            message = "gristmill serve: wrong bearer token"
        else:
            return None
        self.on_refusal("an unauthenticated client", "auth", message)  # the middleware is not told the peer
        raise flight.FlightUnauthenticatedError(message)


class _Stats:
    """Counters for ``do_action("stats")``."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.clients: set[str] = set()
        self.latencies: collections.deque[float] = collections.deque(maxlen=LATENCIES_KEPT)

    def add(self, **counts) -> None:
        with self.lock:
            self.counts.update(counts)

    def snapshot(self, active: int) -> dict:
        with self.lock:
            lat = np.array(self.latencies) if self.latencies else np.zeros(1)
            return {"clients": len(self.clients), **{k: int(v) for k, v in sorted(self.counts.items())},
                    "active_streams": active, "step_latency_p50_s": float(np.percentile(lat, 50)),
                    "step_latency_p99_s": float(np.percentile(lat, 99))}


class _Refusals:
    """Every refusal counted in the stats (``refused`` and ``refused_<kind>``); one WARNING line per client
    host per ``interval_s`` at most, the next one saying how many were left out."""

    def __init__(self, stats: _Stats, interval_s: float):
        self.stats, self.interval_s = stats, interval_s
        self.lock = threading.Lock()
        self.last: dict[str, float] = {}
        self.left_out = collections.Counter()

    def __call__(self, client: str, kind: str, message: str) -> None:
        self.stats.add(refused=1, **{f"refused_{kind}": 1})
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(client, -float("inf")) < self.interval_s:
                self.left_out[client] += 1
                return
            if len(self.last) > 10_000:  # many hosts: forget the quiet ones
                self.last = {c: t for c, t in self.last.items() if now - t < self.interval_s}
            self.last[client] = now
            more = self.left_out.pop(client, 0)
        log.warning("refused %s (%s): %s%s", client, kind, message[:300],
                    f" (and {more} more refusals of this host not logged)" if more else "")


class _Sessions:
    """One INFO line when a session (client host, manifest, split, rank, world size) is first seen, one when it
    has been idle ``idle_s`` (or the server stops) with its totals; swept by a daemon thread."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self.lock = threading.Lock()
        self.open: dict[tuple, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gristmill-serve-sessions", daemon=True)
        self._thread.start()

    def start(self, key: tuple) -> None:
        now = time.monotonic()
        with self.lock:
            s = self.open.get(key)
            new = s is None
            if new:
                s = self.open[key] = {"streams": 0, "steps": 0, "bytes": 0, "errors": 0, "active": 0, "t0": now}
            s["streams"] += 1
            s["active"] += 1
            s["last"] = now
        if new:
            log.info("session start: %s", _session_name(key))

    def end(self, key: tuple, steps: int, nbytes: int, failed: bool) -> None:
        with self.lock:
            s = self.open.get(key)
            if s is None:  # ended at shutdown while this stream was still open
                return
            s["steps"] += steps
            s["bytes"] += nbytes
            s["errors"] += failed
            s["active"] -= 1
            s["last"] = time.monotonic()

    def sweep(self, everything: bool = False) -> None:
        now = time.monotonic()
        with self.lock:
            keys = [k for k, s in self.open.items() if everything or (not s["active"] and now - s["last"] >= self.idle_s)]
            ended = [(k, self.open.pop(k)) for k in keys]
        for k, s in ended:
            log.info("session end: %s: %d streams, %d steps, %d bytes, %d errors in %.1f s%s", _session_name(k),
                     s["streams"], s["steps"], s["bytes"], s["errors"], s["last"] - s["t0"],
                     "" if everything else f" (idle {self.idle_s:g} s)")

    def _run(self) -> None:
        while not self._stop.wait(min(self.idle_s / 2, 5.0)):
            self.sweep()

    def close(self) -> None:
        self._stop.set()
        self.sweep(everything=True)


def _session_name(key: tuple) -> str:
    client, sha, split, rank, world = key
    return f"{client} {sha[:12]} split={split} rank={rank}/{world}"


class _Slots:
    """The stream bounds: global and per client host; a stream past either is refused, not queued."""

    def __init__(self, total: int, per_client: int):
        self.total, self.per_client = total, per_client
        self.lock = threading.Lock()
        self.active = 0
        self.by_client = collections.Counter()

    def take(self, client: str) -> None:
        with self.lock:
            if self.active >= self.total:
                raise flight.FlightUnavailableError(f"gristmill serve: busy ({self.total} streams); retry or use "
                                                    f"another endpoint")
            if self.by_client[client] >= self.per_client:
                raise flight.FlightUnavailableError(f"gristmill serve: {client} has {self.per_client} streams open "
                                                    f"already (the per-client bound)")
            self.active += 1
            self.by_client[client] += 1

    def give(self, client: str) -> None:
        with self.lock:
            self.active -= 1
            self.by_client[client] -= 1
            if not self.by_client[client]:
                del self.by_client[client]


class _Entry:
    """An open Loader and the streams using it (an LRU-evicted entry closes when the last one ends)."""

    def __init__(self, loader: Loader):
        self.loader, self.users, self.evicted = loader, 0, False


class GristmillServer(flight.FlightServerBase):
    """The Flight server; ``serve()`` (or ``wait``) blocks, ``shutdown()`` stops it."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.catalog = Catalog(list(cfg.urls), storage_options=cfg.storage_options,
                               rescan_interval_s=cfg.rescan_interval_s)
        self.stats = _Stats()
        self.refusals = _Refusals(self.stats, cfg.refusal_log_interval_s)
        self.sessions = _Sessions(cfg.session_idle_s)
        self.slots = _Slots(cfg.max_streams, cfg.max_streams_per_client)
        self._entries: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()
        self._entries_lock = threading.Lock()
        self._build_lock = threading.Lock()
        tls = {}
        if cfg.tls_cert:
            tls = {"tls_certificates": [(cfg.tls_cert, cfg.tls_key)]}
            if cfg.tls_client_ca:
                tls.update(verify_client=True, root_certificates=cfg.tls_client_ca)
        middleware = {"auth": _BearerAuth(cfg.token, self.refusals)} if cfg.token else None
        super().__init__(cfg.location, middleware=middleware, **tls)

    # -- the loaders ------------------------------------------------------------------------------
    def _acquire(self, req: Request) -> _Entry:
        """The open entry for the request's (manifest, sampling) key, one more user counted; built on a miss."""
        key = (req.manifest_sha256, req.split, req.seed, req.order, req.window_shards, req.documents)
        entry = self._use(key)
        if entry is not None:
            return entry
        with self._build_lock:  # one build at a time (it reads manifests and document indexes), so one per key
            entry = self._use(key)
            if entry is not None:
                return entry
            pub = self.catalog.load(req.manifest_sha256)
            entry = _Entry(Loader(pub, Sampling(split=req.split, seed=req.seed, order=req.order,
                                                window_shards=req.window_shards, global_batch=1),
                                  caching=Caching(dir=self.cfg.cache_dir, limit_bytes=self.cfg.cache_limit_bytes),
                                  threads=Threads(prefetch=1, workers=0, fetch_workers=1),
                                  batches=Batches(token_dtype=None, pin_memory=False, documents=req.documents)))
            self.stats.add(loaders_opened=1)
            with self._entries_lock:
                entry.users += 1
                self._entries[key] = entry
                while len(self._entries) > self.cfg.max_open:
                    _, old = self._entries.popitem(last=False)
                    old.evicted = True
                    if not old.users:
                        old.loader.close()
            return entry

    def _use(self, key: tuple) -> _Entry | None:
        with self._entries_lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                entry.users += 1
                self.stats.add(loaders_reused=1)
            return entry

    def _release(self, entry: _Entry) -> None:
        with self._entries_lock:
            entry.users -= 1
            close = entry.evicted and not entry.users
        if close:
            entry.loader.close()

    # -- Flight -----------------------------------------------------------------------------------
    def do_get(self, context, ticket):
        client = _host(context.peer())
        try:
            req = Request.decode(ticket.ticket)
        except ProtocolError as e:
            self.refusals(client, "bad_request", str(e))
            raise flight.FlightServerError(str(e)) from None
        try:
            self.slots.take(client)
        except flight.FlightUnavailableError as e:
            self.refusals(client, "busy", str(e))
            raise
        try:
            entry = self._acquire(req)
        except GristmillError as e:
            self.slots.give(client)
            message = f"{type(e).__name__}: {one_line(e)}"
            self.refusals(client, "unknown" if isinstance(e, UnknownManifest) else "error", message)
            raise flight.FlightServerError(message) from None
        except BaseException as e:
            self.slots.give(client)
            log.exception("opening %s for %s failed", req.manifest_sha256, client)
            raise flight.FlightServerError(f"internal error: {one_line(e)}") from None
        size = reply_bytes(entry.loader.manifest, req)
        if size > self.cfg.max_reply_bytes:
            self.slots.give(client)
            self._release(entry)
            message = (f"bad request: the reply would be {size} bytes ({req.steps} steps of {req.local_batch} rows), "
                       f"over the server's bound of {self.cfg.max_reply_bytes} bytes a request (--max-reply-bytes); "
                       f"ask fewer steps per request (Source.service_steps_per_request)")
            self.refusals(client, "bad_request", message)
            raise flight.FlightServerError(message)
        with self.stats.lock:
            self.stats.clients.add(client)
        self.stats.add(requests=1)
        stream = _Stream(self, entry, req, client)
        self.sessions.start(stream.session)
        return flight.GeneratorStream(stream.schema, stream)

    def shutdown(self):
        """Stop serving; every open session's totals are logged."""
        super().shutdown()
        self.sessions.close()

    def do_action(self, context, action):
        kind = action.type
        if kind == "stats":
            yield json.dumps(self.stats.snapshot(self.slots.active)).encode()
        elif kind == "manifest":
            yield self._manifest(action.body.to_pybytes())
        else:
            raise flight.FlightServerError(f"unknown action {kind[:40]!r}; actions: stats, manifest")

    def list_actions(self, context):
        return [("stats", "JSON counters: clients, requests, bytes, cache hits/misses, step latency, streams"),
                ("manifest", 'the manifest JSON of {"sha256": ...} or {"name": ...} (a mixture: with its components)')]

    def _manifest(self, body: bytes) -> bytes:
        usage = 'bad request: the manifest action takes {"sha256": HEX} or {"name": NAME}'
        try:
            ask = json_object(body, "the manifest action's body")
        except ProtocolError:
            raise flight.FlightServerError(usage) from None
        if len(ask) != 1 or next(iter(ask)) not in ("sha256", "name") or not isinstance(next(iter(ask.values())), str):
            raise flight.FlightServerError(usage)
        try:
            sha = ask["sha256"] if "sha256" in ask else self.catalog.latest_sha(ask["name"])
            if not SHA256.fullmatch(sha):
                raise ProtocolError("bad request: sha256: expected 64 lowercase hex digits")
            pub = self.catalog.load(sha)
        except GristmillError as e:
            raise flight.FlightServerError(f"{type(e).__name__}: {one_line(e)}") from None
        comps = [c.manifest.to_json() for c in getattr(pub, "components", ())]
        return json.dumps({"manifest": pub.manifest.to_json(), "components": comps}).encode()


class _Stream:
    """The record batches of one request; holds its slot and entry until finished or dropped."""

    def __init__(self, server: GristmillServer, entry: _Entry, req: Request, client: str):
        self.server, self.entry, self.req, self.client = server, entry, req, client
        self.step, self.bytes, self.t0, self.done = req.start_step, 0, time.perf_counter(), False
        m = entry.loader.manifest
        fields = [("tokens", pa.list_(pa.from_numpy_dtype(np.dtype(m.token_dtype)), m.row_tokens)), ("indices", pa.int64())]
        if req.documents:
            fields.append(("position_ids", pa.list_(pa.int32(), m.seq_len)))
        self.schema = pa.schema(fields, metadata={META_SHA: req.manifest_sha256.encode(), META_REQUEST: req.encode()})
        self.session = (client, req.manifest_sha256, req.split, req.rank, req.world_size)
        self.batches = None  # Loader.rows_at_many over the request's steps, made on the first step (in gRPC's thread)
        self.step_bytes = step_bytes(m, req.local_batch, req.documents)
        self.steps_at_once = max(1, min(req.steps, ASSEMBLE_BYTES // self.step_bytes, ASSEMBLE_ROWS // req.local_batch))
        self.ready: collections.deque[pa.RecordBatch] = collections.deque()  # this chunk's steps not sent yet

    def __iter__(self):
        return self

    def __next__(self):
        req = self.req
        if self.done or self.step >= req.start_step + req.steps:
            self.finish("done")
            raise StopIteration
        if not self.ready:
            self._assemble()
        rb = self.ready.popleft()
        self.bytes += self.step_bytes
        meta = b'{"step": %d}' % self.step
        self.step += 1
        return rb, pa.py_buffer(meta)

    def _assemble(self) -> None:
        """The next ``steps_at_once`` steps, assembled in one go and sliced into a record batch a step (no copy)."""
        req, t = self.req, time.perf_counter()
        try:
            if self.batches is None:
                starts = [req.first_index(s) for s in range(req.start_step, req.start_step + req.steps)]
                self.batches = self.entry.loader.rows_at_many(starts, req.local_batch, self.steps_at_once)
            batch, metrics = next(self.batches)
        except GristmillError as e:
            self.finish(f"failed: {one_line(e)}")
            raise flight.FlightServerError(f"{type(e).__name__}: {one_line(e)}") from None
        except BaseException as e:
            log.exception("step %d of %s failed", self.step, req.manifest_sha256)
            self.finish(f"failed: {one_line(e)}")
            raise flight.FlightServerError(f"internal error: {one_line(e)}") from None
        rb = to_record_batch(batch, self.schema)
        n = rb.num_rows // req.local_batch
        self.ready.extend(rb.slice(k * req.local_batch, req.local_batch) for k in range(n))
        stats = self.server.stats
        with stats.lock:
            stats.latencies.append((time.perf_counter() - t) / n)
            stats.counts.update(steps=n, bytes=n * self.step_bytes, cache_hits=metrics["cache_hits"],
                                cache_misses=metrics["cache_misses"], bytes_downloaded=metrics["bytes_downloaded"])

    def finish(self, how: str) -> None:
        """Free the slot and the entry, once; add the stream to its session; one DEBUG line."""
        if self.done:
            return
        self.done = True
        self.batches = None  # the rest of the plan
        self.ready.clear()
        self.server.slots.give(self.client)
        self.server._release(self.entry)
        if self.bytes >= TRIM_AFTER_BYTES or (how != "done" and self.req.steps * self.req.local_batch >= PLAN_ROWS):
            release_free_heap()  # a large stream, or a long one cut short: its plan and buffers go back too
        req = self.req
        self.server.sessions.end(self.session, self.step - req.start_step, self.bytes, how != "done")
        log.debug("%s: %s split=%s rank=%d/%d steps %d..%d: %d of %d steps, %d bytes in %.3f s, %s", self.client,
                 req.manifest_sha256[:12], req.split, req.rank, req.world_size, req.start_step,
                 req.start_step + req.steps - 1, self.step - req.start_step, req.steps, self.bytes,
                 time.perf_counter() - self.t0, how)

    def __del__(self):  # gRPC dropped the stream (a client gone mid-stream) before it ended
        self.finish("dropped by the client")


def release_free_heap() -> None:
    """glibc keeps freed memory of large transient arrays (a big request's plan and buffer) in its heap;
    hand it back, so a server's RSS after a large request is what it holds, not its high-water mark."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def to_record_batch(batch: dict, schema: pa.Schema) -> pa.RecordBatch:
    """A Loader batch (``token_dtype=None``) as a reply's record batch; ``tokens`` without a copy."""
    tokens = np.ascontiguousarray(batch["tokens"].numpy())
    rows, width = tokens.shape
    values = pa.Array.from_buffers(schema.field("tokens").type.value_type, tokens.size, [None, pa.py_buffer(tokens)])
    columns = [pa.FixedSizeListArray.from_arrays(values, width), pa.array(batch["indices"].numpy())]
    if "position_ids" in schema.names:
        pos = batch["position_ids"].numpy().astype(np.int32)
        columns.append(pa.FixedSizeListArray.from_arrays(pa.array(pos.reshape(-1)), width - 1))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _host(peer) -> str:
    peer = peer.decode() if isinstance(peer, bytes) else str(peer)
    return peer.rsplit(":", 1)[0] if ":" in peer else peer
