"""``gristmill serve``: a stateless Arrow Flight server of training batches (docs/service.md).

Every request (loader/service/protocol.py) names everything a batch depends on, so the server
keeps no per-client state and any replica answers any request. Per (manifest, split, seed,
order, window_shards, documents) it keeps one :class:`~gristmill.loader.Loader` (its order, its
document boundaries and its view of the node-local ``ShardCache``, verified downloads and
eviction included) in an LRU of ``max_open`` entries, and answers rank ``r``'s step ``s`` with
``Loader.rows_at_many`` (the one assembly of a step; a request's steps planned in one vectorised
call, up to ``ASSEMBLE_BYTES`` and ``ASSEMBLE_ROWS`` of steps assembled at a time when gRPC asks for
the next record batch, each such group sent as one record batch: protocol 2, protocol.py), in the
shards' own token dtype. Its loaders make
numpy arrays (``Batches(numpy=True)``): the server never imports torch (docs/service.md, "A server without torch").

Transport: a ``grpcio`` server speaking Arrow Flight's protobuf service (wire.py), so gRPC refuses a request
message over 8 KiB before buffering it (pyarrow's Flight server cannot be told to). Bounds (admission.py): streams
and reply bytes in flight, in all and per client identity; a stream past a bound waits ``admission_wait_s`` for
room, then is refused as busy (``FlightUnavailableError``: the client backs off and retries until its deadline);
a stream whose reader took nothing for ``stream_idle_s`` is cancelled. A request whose reply would exceed
``max_reply_bytes`` is refused once its manifest is known (``bad request``: ask fewer steps a request). A
request is checked before any work; every refusal is one line and the server keeps serving the others. A
client that disconnects mid-stream frees its slot when gRPC ends the call.

Logging: one INFO line when a client session (client host, manifest, split, rank/world) is first
seen and one when it has been idle ``session_idle_s`` or the server stops, with its totals
(streams, steps, bytes, errors); one DEBUG line per stream. Refusals (bad request, unknown
manifest, authentication, busy) are counted in ``stats`` by kind and logged at WARNING, at most one
line per client host per ``refusal_log_interval_s`` (the lines left out are counted in the next).

Security (:class:`ServeConfig`): a bearer token checked on every call (constant-time compare); TLS from certificate and key files, optionally mutual TLS; listening
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

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pyarrow as pa

from gristmill.errors import GristmillError, UsageError

from ..loader import PLAN_ROWS, Loader
from ..options import Batches, Caching, Sampling, Source, Threads
from .admission import Admission, Busy, Idle
from .catalog import Catalog, UnknownManifest
from .config import ServeConfig, is_loopback  # noqa: F401  (ServeConfig lives beside, checked before the import)
from .protocol import (CLIENT_HEADER, CLIENT_ID, META_REQUEST, META_SHA, SHA256, TOKEN_ENV, ProtocolError, Request,
                       group_metadata, json_object, one_line, reply_bytes, reply_schema, step_bytes)
from .wire import MAX_REQUEST_BYTES, SERVICE, VERBS, fields, flight_data, message

log = logging.getLogger(__name__)

LATENCIES_KEPT = 4096  # per-step assembly latencies the stats' percentiles are computed over
ASSEMBLE_BYTES = 1 << 20  # a stream assembles at most this many bytes of steps at once (at least one step),
ASSEMBLE_ROWS = 256  # and at most this many rows (its pins: as many shards at most, or one step's)
TRIM_AFTER_BYTES = 16 << 20  # a stream that sent this much returns the freed heap to the system when it ends
ACTION_THREADS = 16  # gRPC threads beyond the streams' (actions, refusals)


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


class _Entry:
    """An open Loader and the streams using it (an LRU-evicted entry closes when the last one ends)."""

    def __init__(self, loader: Loader):
        self.loader, self.users, self.evicted = loader, 0, False


class GristmillServer:
    """The Flight server (a ``grpcio`` server speaking Flight's service, wire.py), serving from the start;
    ``port`` is the port it listens on, ``shutdown()`` stops it."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.catalog = Catalog(list(cfg.urls), storage_options=cfg.storage_options,
                               rescan_interval_s=cfg.rescan_interval_s)
        self.stats = _Stats()
        self.refusals = _Refusals(self.stats, cfg.refusal_log_interval_s)
        self.sessions = _Sessions(cfg.session_idle_s)
        self.admission = Admission(cfg.max_streams, cfg.max_inflight_bytes, cfg.max_streams_per_client,
                                   cfg.max_inflight_bytes_per_client, cfg.admission_wait_s)
        self.idle = Idle(cfg.stream_idle_s, self._idle_cancelled)
        self._token = cfg.token.encode() if cfg.token else None
        self._entries: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()
        self._entries_lock = threading.Lock()
        self._build_lock = threading.Lock()
        # a thread per stream (admitted or waiting for room) and a few for actions; past that gRPC refuses at once
        workers = 2 * cfg.max_streams + ACTION_THREADS
        self._grpc = grpc.server(ThreadPoolExecutor(workers, thread_name_prefix="gristmill-serve"),
                                 maximum_concurrent_rpcs=workers, options=[
                                     ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                                     # no receive window grown by bandwidth probing: requests are tiny, and a
                                     # grown window let 8 unauthenticated 128 MiB requests buffer up to ~190 MB
                                     # before their length was refused (the replies' window is the client's)
                                     ("grpc.http2.bdp_probe", 0),
                                     ("grpc.max_send_message_length", -1),
                                     ("grpc.so_reuseport", 0)])  # a port in use is an error, not a shared port
        self._grpc.add_generic_rpc_handlers([self._handlers()])
        address = f"[{cfg.host}]:{cfg.port}" if ":" in cfg.host else f"{cfg.host}:{cfg.port}"
        try:
            if cfg.tls_cert:
                creds = grpc.ssl_server_credentials([(cfg.tls_key, cfg.tls_cert)], root_certificates=cfg.tls_client_ca,
                                                    require_client_auth=cfg.tls_client_ca is not None)
                self.port = self._grpc.add_secure_port(address, creds)
            else:
                self.port = self._grpc.add_insecure_port(address)
        except RuntimeError as e:
            raise UsageError(f"gristmill serve: cannot listen on {address}: {one_line(e)} (a port in use?)") from None
        self._grpc.start()

    def _handlers(self) -> grpc.GenericRpcHandler:
        served = {"DoGet": self.do_get, "DoAction": self.do_action, "ListActions": self.list_actions}
        handlers = {}
        for verb, (streamed_in, streamed_out) in VERBS.items():
            fn = served.get(verb) or self._unimplemented(verb)
            make = {(False, True): grpc.unary_stream_rpc_method_handler, (False, False): grpc.unary_unary_rpc_method_handler,
                    (True, True): grpc.stream_stream_rpc_method_handler}[(streamed_in, streamed_out)]
            handlers[verb] = make(fn)
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _unimplemented(self, verb: str):
        def refuse(request, context):
            self._authenticate(context)
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          f"gristmill serve does not implement {verb}; it answers DoGet (a ticket of a request, "
                          f"docs/service.md), DoAction (stats, manifest) and ListActions")
        return refuse

    # -- who is calling ---------------------------------------------------------------------------
    def _authenticate(self, context) -> str:
        """The caller's identity (wire header ``gristmill-client``, else its TLS peer, else its host), after its
        token is checked (constant-time compare); a refusal aborts the call."""
        meta = dict(context.invocation_metadata())
        host = _host(context.peer())
        if self._token is not None:
            got = meta.get("authorization", "")
            got = got.encode() if isinstance(got, str) else bytes(got)
            if not got:
                message = ("gristmill serve: no bearer token (give the client service_token, service_token_file or "
                           f"${TOKEN_ENV})")
            elif not (got.startswith(b"Bearer ") and hmac.compare_digest(got[7:], self._token)):
                message = "gristmill serve: wrong bearer token"
            else:
                message = None
            if message:
                self.refusals(host, "auth", message)
                context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        client = meta.get(CLIENT_HEADER)
        if isinstance(client, str) and CLIENT_ID.fullmatch(client):
            return f"{client}"
        peer = context.auth_context().get("x509_common_name")
        return f"tls:{peer[0].decode(errors='replace')}" if peer else host

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
                                  source=Source(storage_options=dict(self.cfg.storage_options)),  # its shards too
                                  caching=Caching(dir=self.cfg.cache_dir, limit_bytes=self.cfg.cache_limit_bytes),
                                  threads=Threads(prefetch=1, workers=0, fetch_workers=1),
                                  batches=Batches(token_dtype=None, documents=req.documents, numpy=True)))
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
    def do_get(self, request: bytes, context):
        client = self._authenticate(context)
        try:
            req = Request.decode(fields(request, "ticket").get(1, b""))
        except ProtocolError as e:
            self.refusals(client, "bad_request", str(e))
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        try:
            entry = self._acquire(req)
        except GristmillError as e:
            message = f"{type(e).__name__}: {one_line(e)}"
            self.refusals(client, "unknown" if isinstance(e, UnknownManifest) else "error", message)
            context.abort(grpc.StatusCode.UNKNOWN, message)
        except Exception as e:  # noqa: BLE001 - one line to the client, the traceback in the log
            log.exception("opening %s for %s failed", req.manifest_sha256, client)
            context.abort(grpc.StatusCode.UNKNOWN, f"internal error: {one_line(e)}")
        size = reply_bytes(entry.loader.manifest, req)
        if size > self.cfg.max_reply_bytes:
            self._release(entry)
            message = (f"bad request: the reply would be {size} bytes ({req.steps} steps of {req.local_batch} rows), "
                       f"over the server's bound of {self.cfg.max_reply_bytes} bytes a request (--max-reply-bytes); "
                       f"ask fewer steps per request (Source.service_steps_per_request)")
            self.refusals(client, "bad_request", message)
            context.abort(grpc.StatusCode.UNKNOWN, message)
        stream = _Stream(self, entry, req, client)
        try:
            self.admission.enter(client, stream.cost)
        except Busy as e:
            self._release(entry)
            self.refusals(client, "busy", str(e))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        stream.admitted = True
        if not context.add_callback(lambda: stream.finish("dropped by the client")):  # already over
            stream.finish("dropped by the client")
            return iter(())
        with self.stats.lock:
            self.stats.clients.add(client)
        self.stats.add(requests=1)
        self.sessions.start(stream.session)
        self.idle.add(stream, context)
        return stream.messages(context)

    def _idle_cancelled(self, stream: "_Stream") -> None:
        self.stats.add(cancelled_idle=1)
        log.warning("cancelled a stream of %s: not read for %g s (--stream-idle-s)", stream.client, self.cfg.stream_idle_s)

    def shutdown(self):
        """Stop serving; every open session's totals are logged."""
        self._grpc.stop(grace=1.0).wait()
        self.idle.close()
        self.sessions.close()

    def do_action(self, request: bytes, context):
        self._authenticate(context)
        try:
            action = fields(request, "action")
        except ProtocolError as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))
        kind = action.get(1, b"").decode(errors="replace")
        if kind == "stats":
            body = json.dumps(self.stats.snapshot(self.admission.active)).encode()
        elif kind == "manifest":
            try:
                body = self._manifest(action.get(2, b""))
            except ProtocolError as e:
                context.abort(grpc.StatusCode.UNKNOWN, str(e))
        else:
            context.abort(grpc.StatusCode.UNKNOWN, f"unknown action {kind[:40]!r}; actions: stats, manifest")
        return iter([message(f1=body)])

    def list_actions(self, request: bytes, context):
        self._authenticate(context)
        return iter([message(f1=k.encode(), f2=d.encode()) for k, d in ACTIONS])

    def _manifest(self, body: bytes) -> bytes:
        usage = 'bad request: the manifest action takes {"sha256": HEX} or {"name": NAME}'
        try:
            ask = json_object(body, "the manifest action's body")
        except ProtocolError:
            raise ProtocolError(usage) from None
        if len(ask) != 1 or next(iter(ask)) not in ("sha256", "name") or not isinstance(next(iter(ask.values())), str):
            raise ProtocolError(usage)
        try:
            sha = ask["sha256"] if "sha256" in ask else self.catalog.latest_sha(ask["name"])
            if not SHA256.fullmatch(sha):
                raise ProtocolError("bad request: sha256: expected 64 lowercase hex digits")
            pub = self.catalog.load(sha)
        except GristmillError as e:
            raise ProtocolError(f"{type(e).__name__}: {one_line(e)}") from None
        comps = [c.manifest.to_json() for c in getattr(pub, "components", ())]
        return json.dumps({"manifest": pub.manifest.to_json(), "components": comps}).encode()


ACTIONS = (("stats", "JSON counters: clients, requests, bytes, cache hits/misses, step latency, streams"),
           ("manifest", 'the manifest JSON of {"sha256": ...} or {"name": ...} (a mixture: with its components)'))


class _Stream:
    """The record batches of one request; holds its admission and entry until finished or dropped."""

    def __init__(self, server: GristmillServer, entry: _Entry, req: Request, client: str):
        self.server, self.entry, self.req, self.client = server, entry, req, client
        self.step, self.bytes, self.t0, self.done, self.admitted = req.start_step, 0, time.perf_counter(), False, False
        self.lock = threading.Lock()
        m = entry.loader.manifest
        self.schema = reply_schema(m, req.documents).with_metadata({META_SHA: req.manifest_sha256.encode(),
                                                                    META_REQUEST: req.encode()})
        self.session = (client, req.manifest_sha256, req.split, req.rank, req.world_size)
        self.batches = None  # Loader.rows_at_many over the request's steps, made on the first step (in gRPC's thread)
        self.step_bytes = step_bytes(m, req.local_batch, req.documents)
        self.steps_at_once = max(1, min(req.steps, ASSEMBLE_BYTES // self.step_bytes, ASSEMBLE_ROWS // req.local_batch))
        self.cost = server.admission.cost(self.steps_at_once * self.step_bytes)  # its chunk: what it holds at most
        self.waiting_since: float | None = None  # when it last handed a message to its reader (Idle's clock)

    def messages(self, context):
        """The reply's FlightData messages: the schema, then a record batch a group of steps. gRPC resumes this generator
        when its reader has room; ``waiting_since`` is set while it is suspended there. A step that fails
        ends the call with its one line (gRPC UNKNOWN: a ``FlightServerError``)."""
        try:
            self.waiting_since = time.monotonic()
            yield flight_data(self.schema.serialize())
            self.waiting_since = None
            for rb, meta in self.record_batches():
                data = flight_data(rb.serialize(), meta)
                self.waiting_since = time.monotonic()
                yield data
                self.waiting_since = None
            self.finish("done")
        except _Failed as e:
            context.abort(grpc.StatusCode.UNKNOWN, str(e))

    def record_batches(self):
        """(record batch, app metadata ``{"first_step": s, "steps": n}``) of each group of ``steps_at_once`` steps
        (the last one fewer), in step order."""
        end = self.req.start_step + self.req.steps
        while self.step < end and not self.done:
            rb = self._assemble()
            n = rb.num_rows // self.req.local_batch
            meta = group_metadata(self.step, n)
            self.bytes += n * self.step_bytes
            self.step += n
            yield rb, meta

    def _assemble(self) -> pa.RecordBatch:
        """The next ``steps_at_once`` steps, assembled in one go: one record batch."""
        req, t = self.req, time.perf_counter()
        try:
            if self.batches is None:
                starts = [req.first_index(s) for s in range(req.start_step, req.start_step + req.steps)]
                self.batches = self.entry.loader.rows_at_many(starts, req.local_batch, self.steps_at_once)
            batch, metrics = next(self.batches)
        except GristmillError as e:
            self.finish(f"failed: {one_line(e)}")
            raise _Failed(f"{type(e).__name__}: {one_line(e)}") from None
        except Exception as e:  # noqa: BLE001 - one line to the client, the traceback in the log
            log.exception("step %d of %s failed", self.step, req.manifest_sha256)
            self.finish(f"failed: {one_line(e)}")
            raise _Failed(f"internal error: {one_line(e)}") from None
        rb = to_record_batch(batch, self.schema)
        n = rb.num_rows // req.local_batch
        stats = self.server.stats
        with stats.lock:
            stats.latencies.append((time.perf_counter() - t) / n)
            stats.counts.update(steps=n, bytes=n * self.step_bytes, cache_hits=metrics["cache_hits"],
                                cache_misses=metrics["cache_misses"], bytes_downloaded=metrics["bytes_downloaded"])
        return rb

    def finish(self, how: str) -> None:
        """Free the admission and the entry, once (the generator's end or gRPC's callback when the call ends);
        add the stream to its session; one DEBUG line."""
        with self.lock:
            if self.done:
                return
            self.done = True
        self.batches = None  # the rest of the plan
        server = self.server
        server.idle.remove(self)
        server.admission.leave(self.client, self.cost)
        server._release(self.entry)
        if self.bytes >= TRIM_AFTER_BYTES or (how != "done" and self.req.steps * self.req.local_batch >= PLAN_ROWS):
            release_free_heap()  # a large stream, or a long one cut short: its plan and buffers go back too
        req = self.req
        server.sessions.end(self.session, self.step - req.start_step, self.bytes, how != "done")
        log.debug("%s: %s split=%s rank=%d/%d steps %d..%d: %d of %d steps, %d bytes in %.3f s, %s", self.client,
                  req.manifest_sha256[:12], req.split, req.rank, req.world_size, req.start_step,
                  req.start_step + req.steps - 1, self.step - req.start_step, req.steps, self.bytes,
                  time.perf_counter() - self.t0, how)


class _Failed(Exception):
    """A step that failed mid-stream (its one line)."""


def release_free_heap() -> None:
    """glibc keeps freed memory of large transient arrays (a big request's plan and buffer) in its heap;
    hand it back, so a server's RSS after a large request is what it holds, not its high-water mark."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def to_record_batch(batch: dict, schema: pa.Schema) -> pa.RecordBatch:
    """A Loader batch (``token_dtype=None``, ``numpy=True``) as a reply's record batch; ``tokens`` without a copy."""
    tokens = np.ascontiguousarray(batch["tokens"])
    rows, width = tokens.shape
    values = pa.Array.from_buffers(schema.field("tokens").type.value_type, tokens.size, [None, pa.py_buffer(tokens)])
    columns = [pa.FixedSizeListArray.from_arrays(values, width), pa.array(batch["indices"])]
    if "position_ids" in schema.names:
        pos = batch["position_ids"].astype(np.int32)
        columns.append(pa.FixedSizeListArray.from_arrays(pa.array(pos.reshape(-1)), width - 1))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _host(peer) -> str:
    """The host of a gRPC peer (``ipv4:10.0.0.5:41234``, ``ipv6:[::1]:41234``, ``unix:...``)."""
    peer = peer.decode() if isinstance(peer, bytes) else str(peer)
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    return address.rsplit(":", 1)[0].strip("[]")
