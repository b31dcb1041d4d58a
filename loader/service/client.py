"""The client side of ``gristmill serve``: the batches of a :class:`~gristmill.loader.Loader` whose
``Source.service`` names endpoints, fetched instead of assembled from a local cache.

:class:`ServiceBatches` is what the Loader delegates to: ``pipeline(start)`` returns an object
with the Loader's pipeline interface (``next() -> (batch, metrics)``, ``close()``). It asks for
ranges of ``Source.service_steps_per_request`` steps (at most ``RANGE_BYTES`` of reply, and what the
protocol's row bound and a server's default reply bound allow), two ranges in flight; range ``k`` goes first to endpoint
``k mod n`` (a deterministic spread) and, on any error, deadline (``Source.service_timeout_s``)
or a reply that does not check out, the whole range is asked again of the next endpoint; after each round
over all endpoints a backoff with jitter, until ``Source.service_deadline_s`` (a restart of every server
shorter than that costs only the wait). A range's batches are handed over
only once the whole range has arrived and been checked (manifest hash, request echo, columns, the steps
each record batch says it holds (protocol 2: a group of steps a record batch), every row's global index, once
per reply and vectorised), so no sample is lost, duplicated or reordered.

The batches are the in-process Loader's, bit for bit: ``tokens`` in ``token_dtype`` (widened
from the shards' dtype here), ``input_ids`` / ``labels`` views, ``indices``, ``step`` and with
``documents`` ``position_ids``, ``cu_seqlens``, ``max_seqlen`` (from ``position_ids == 0`` by
``loader.documents.segments_to_batch``, as in-process).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import random
import re
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from gristmill.errors import UsageError
from gristmill.manifests import Published
from gristmill.manifests.mixture import MixtureManifest, PublishedMixture, manifest_from_json, with_components

from ..documents import segments_to_batch
from ..options import Source
from .protocol import (CLIENT_HEADER, CLIENT_ID, DEFAULT_MAX_REPLY_BYTES, MAX_ROWS, MAX_STEPS, META_REQUEST, META_SHA,
                       PROTOCOL_VERSION, SHA256, TOKEN_ENV, Request, group_metadata, one_line, reply_schema, step_bytes)

log = logging.getLogger(__name__)

RANGES_IN_FLIGHT = 2
FIRST_RANGE_STEPS = 2  # a pass's first range; each next one twice as long, up to range_steps
MAX_BACKOFF_S = 1.0  # the longest wait between rounds over the endpoints: a server back is found within ~1 s
WAIT_LOG_S = 10.0  # while a range waits for the service, a log line this often
CLIENT_ENV = "GRISTMILL_CLIENT_ID"
# gRPC's own reconnect backoff grows to 120 s by default: a server back after a long outage would wait that long
RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
             ("grpc.max_reconnect_backoff_ms", 1000)]
RANGE_BYTES = 16 << 20  # a request's reply at most this (unless one step is more): up to 3 ranges held per loader


class ServiceError(UsageError):
    """The service could not serve a request on any endpoint, or refused it (one line)."""


class ReplyMismatch(Exception):
    """A reply that is not the answer to the request (another manifest, step or row): retried elsewhere."""


def resolve_token(source: Source) -> str | None:
    """The bearer token: ``service_token``, else the first line of ``service_token_file``, else $GRISTMILL_SERVE_TOKEN."""
    if source.service_token:
        return source.service_token
    if source.service_token_file:
        with open(source.service_token_file) as f:
            return f.read().strip() or None
    return os.environ.get(TOKEN_ENV) or None


class Endpoints:
    """One Flight client per endpoint (created on first use; gRPC reconnects by itself) and the call options."""

    def __init__(self, source: Source):
        self.urls = tuple(source.service)
        token = resolve_token(source)
        headers = [(CLIENT_HEADER.encode(), client_id().encode())]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        self.options = flight.FlightCallOptions(timeout=source.service_timeout_s, headers=headers)
        self.tls = {key: _read(path) for key, path in (("tls_root_certs", source.service_tls_root),
                                                        ("cert_chain", source.service_tls_cert),
                                                        ("private_key", source.service_tls_key)) if path}
        self._clients: dict[str, flight.FlightClient] = {}
        self._answered: set[str] = set()  # endpoints that have answered a call (the TLS hint is for the others)
        # endpoints that closed the socket without ever answering, and how often: a handshake they refuse. "localhost"
        # resolves to ::1 and 127.0.0.1, so the last error of an attempt may be the refused IPv6 address instead.
        self._tls_suspect: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def client(self, url: str) -> flight.FlightClient:
        with self._lock:
            if url not in self._clients:
                self._clients[url] = flight.FlightClient(url, generic_options=RECONNECT,
                                                         **(self.tls if url.startswith("grpc+tls") else {}))
            return self._clients[url]

    def answered(self, url: str) -> None:
        self._answered.add(url)

    def reached(self, url: str) -> bool:
        return url in self._answered

    def describe(self, e: Exception, url: str) -> str:
        """``reason`` for this endpoint, keeping its handshake hint once any attempt at it earned one."""
        client_cert = "cert_chain" in self.tls
        text = reason(e, url, self.reached(url), client_cert)
        hint = handshake_hint(url, client_cert)
        if hint in text:
            self._tls_suspect[url] += 1
        elif self._tls_suspect[url] and not self.reached(url):
            text += hint
        return text

    def all_refuse_handshake(self) -> bool:
        """Every endpoint has closed this client's socket ``HANDSHAKE_TRIES`` times without ever answering: a plain
        client at a TLS server, or a TLS client without the certificate a mutual-TLS server asks for. Waiting out
        ``service_deadline_s`` would not mend that configuration error."""
        return all(self._tls_suspect[u] >= HANDSHAKE_TRIES and not self.reached(u) for u in self.urls)

    def action(self, url: str, name: str, body: dict) -> bytes:
        results = list(self.client(url).do_action(flight.Action(name, json.dumps(body).encode()), self.options))
        return results[0].body.to_pybytes()

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def served_data(name_or_sha: str, source: Source) -> Published | PublishedMixture:
    """The manifest (and a mixture's components) from the service, for a client that cannot read the
    store: ``name_or_sha`` is a manifest sha256 or a dataset/mixture name (its latest version). Every
    manifest is hash-checked here, a mixture's components against the hashes it pins."""
    endpoints = Endpoints(source)
    body = {"sha256": name_or_sha} if SHA256.fullmatch(name_or_sha) else {"name": name_or_sha}
    expected = body.get("sha256", source.expected_sha256)
    errors = []
    try:
        for url in endpoints.urls:
            try:
                reply = json.loads(endpoints.action(url, "manifest", body))
            except flight.FlightError as e:
                errors.append(f"{url}: {endpoints.describe(e, url)}")
                continue
            m = manifest_from_json(reply["manifest"], expected_sha256=expected, source=f"{url} manifest")
            pub = Published(m, f"{url}#{m.sha256}")
            if not isinstance(m, MixtureManifest):
                return pub
            texts = dict(zip([c.name for c in m.components], reply["components"], strict=True))

            def load(c, url=url):
                cm = manifest_from_json(texts[c.name], expected_sha256=c.sha256, source=f"{url} component {c.name}")
                return Published(cm, f"{url}#{cm.sha256}")

            return with_components(m, pub.url, load)
    finally:
        endpoints.close()
    raise ServiceError(f"no endpoint gave the manifest of {name_or_sha!r}: {'; '.join(errors)}")


class ServiceBatches:
    """A Loader's batches from ``gristmill serve`` (the Loader's ``remote``); see the module docstring."""

    def __init__(self, loader):
        self.ld = loader
        self.endpoints = Endpoints(loader.source)
        self.range_steps = range_steps(loader)
        self.schema = reply_schema(loader.manifest, bool(loader.batches.documents))  # every reply's columns
        self.pool = ThreadPoolExecutor(RANGES_IN_FLIGHT, thread_name_prefix="gristmill-service")
        self.stats = collections.Counter()  # bytes, requests, retries (updated under stats_lock)
        self.stats_lock = threading.Lock()
        self.closed = threading.Event()  # close(): a range waiting out an outage gives up at once

    def request(self, start_step: int, steps: int) -> Request:
        ld = self.ld
        return Request(manifest_sha256=ld.manifest.sha256, split=ld.split, seed=ld.seed, order=ld.order_name,
                       window_shards=ld.window_shards, global_batch=ld.global_batch, rank=ld.rank,
                       world_size=ld.world_size, start_step=start_step, steps=steps,
                       documents=bool(ld.batches.documents))

    def pipeline(self, start: int) -> "_ServicePipeline":
        return _ServicePipeline(self, start)

    # -- one range, with failover (runs in a pool thread) ------------------------------------------
    def fetch(self, req: Request, k: int) -> list[dict]:
        """The batches of ``req``, trying the endpoints in turn from ``k mod n`` until ``service_deadline_s``:
        after each round over all of them, a backoff (doubled each round up to ``MAX_BACKOFF_S``, with jitter so
        that the ranks of a restarted service do not come back in step) and, every ``WAIT_LOG_S``, a log line."""
        urls, src = self.endpoints.urls, self.ld.source
        errors: dict[str, str] = {}  # each endpoint's last error
        t0 = time.monotonic()
        deadline, logged, attempt = t0 + src.service_deadline_s, t0, 0
        while True:
            url = urls[(k + attempt) % len(urls)]
            try:
                batches, nbytes = self._get(url, req)
                with self.stats_lock:
                    self.stats["requests"] += 1
                    self.stats["bytes"] += nbytes
                return batches
            except (flight.FlightError, pa.ArrowException, ReplyMismatch, OSError) as e:
                if _refused(e):  # the same request is refused everywhere: a client error, not a failure
                    raise ServiceError(f"gristmill serve at {url}: {self.endpoints.describe(e, url)}"
                                       f"{_older_server(e)}") from e
                errors[url] = self.endpoints.describe(e, url)
                if self.endpoints.all_refuse_handshake():
                    raise ServiceError(f"steps {req.start_step}..{req.start_step + req.steps - 1}: "
                                       + "; ".join(f"{u}: {m}" for u, m in errors.items())) from e
                with self.stats_lock:
                    self.stats["retries"] += 1
                log.debug("steps %d..%d from %s failed (%s)", req.start_step, req.start_step + req.steps - 1, url,
                          errors[url])
            attempt += 1
            if attempt % len(urls):
                continue
            now = time.monotonic()
            if now >= deadline:
                raise ServiceError(f"steps {req.start_step}..{req.start_step + req.steps - 1}: no endpoint served them "
                                   f"in {src.service_deadline_s:g} s (service_deadline_s): "
                                   + "; ".join(f"{u}: {m}" for u, m in errors.items()))
            if now - logged >= WAIT_LOG_S or attempt == len(urls):
                logged = now
                log.warning("waiting for gristmill serve: steps %d..%d, %.0f s of %g s (service_deadline_s) spent; %s",
                            req.start_step, req.start_step + req.steps - 1, now - t0, src.service_deadline_s,
                            "; ".join(f"{u}: {m}" for u, m in errors.items()))
            backoff = min(src.backoff_s * 2 ** (attempt // len(urls) - 1), MAX_BACKOFF_S)
            if self.closed.wait(min(backoff * random.uniform(0.5, 1.0), max(0.0, deadline - now))):
                raise ServiceError("the loader was closed while its service was unreachable")

    def _get(self, url: str, req: Request) -> tuple[list[dict], int]:
        """The checked batches of one reply and its bytes. Its record batches (protocol 2: a group of consecutive
        steps each) are framed-checked as they arrive: the group's app metadata names the next step and its row
        count, and the groups together are the steps asked for, no more."""
        ticket = req.encode()
        reader = self.endpoints.client(url).do_get(flight.Ticket(ticket), self.endpoints.options)
        meta = reader.schema.metadata or {}
        self.endpoints.answered(url)
        if meta.get(META_SHA) != req.manifest_sha256.encode() or meta.get(META_REQUEST) != ticket:
            raise ReplyMismatch(f"reply for manifest {meta.get(META_SHA, b'?')[:64].decode(errors='replace')}, "
                                f"not the request's {req.manifest_sha256}")
        if not reader.schema.remove_metadata().equals(self.schema):
            raise ReplyMismatch(f"reply columns {one_line(reader.schema.remove_metadata())}..., not the manifest's "
                                f"{one_line(self.schema)}...")
        groups, step, end, local = [], req.start_step, req.start_step + req.steps, req.local_batch
        try:
            while step < end:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    raise ReplyMismatch(f"stream ended at step {step}, before step {end - 1}") from None
                rows = chunk.data.num_rows
                got = chunk.app_metadata.to_pybytes() if chunk.app_metadata is not None else b""
                n = rows // local
                if got != group_metadata(step, n) or rows != n * local or not 1 <= n <= end - step:
                    raise ReplyMismatch(f"got {got[:60]!r} with {rows} rows, expected the group of steps from {step} "
                                        f"(at most {end - step}, {local} rows each)")
                groups.append(chunk.data)
                step += n
            try:  # the end of the stream: the server has finished (and freed) it
                reader.read_chunk()
            except StopIteration:
                return self._batches(req, groups), sum(g.nbytes for g in groups)
            raise ReplyMismatch(f"more than the {req.steps} steps asked for")
        except BaseException:
            reader.cancel()  # the server frees the stream now, not when this reader is collected
            raise

    def _batches(self, req: Request, groups: list[pa.RecordBatch]) -> list[dict]:
        """A reply's record batches as the in-process Loader's batch dicts, checked against the request once per
        reply (vectorised): every row's global index (so its step and place), no nulls. The reply's tokens are
        copied once, a record batch at a time, into one buffer of ``token_dtype`` (``new_batch``: pinned with
        ``pin_memory``); each step's arrays are views of it, split in one call per array, not sliced a step at a
        time."""
        ld, local, n, start = self.ld, req.local_batch, req.steps, req.start_step
        if any(col.null_count for g in groups for col in g.columns):
            raise ReplyMismatch(f"steps {start}..{start + n - 1}: a reply with null values")
        indices = np.concatenate([g.column(1).to_numpy() for g in groups]).reshape(n, local)
        want = (np.arange(start, start + n, dtype=np.int64) * req.global_batch + req.rank * local)[:, None] + np.arange(local)
        if not np.array_equal(indices, want):
            k = int(np.flatnonzero((indices != want).any(axis=1))[0])
            raise ReplyMismatch(f"step {start + k}: the rows' global indices are not {want[k, 0]}..{want[k, -1]}")
        whole, buf = ld.new_batch(indices.reshape(-1), start)
        row = 0
        for g in groups:  # one copy a record batch into the reply's buffer (widened to token_dtype)
            buf[row:row + g.num_rows] = _rows(g.column(0))
            row += g.num_rows
        views = {k: _split(whole[k], local) for k in ("tokens", "input_ids", "labels", "indices")}
        out = [{"tokens": views["tokens"][k], "input_ids": views["input_ids"][k], "labels": views["labels"][k],
                "indices": views["indices"][k], "step": start + k} for k in range(n)]
        if req.documents:
            is_start = np.concatenate([_rows(g.column(2)) == 0 for g in groups])
            for k, batch in enumerate(out):
                batch.update(segments_to_batch(is_start[k * local:(k + 1) * local], ld.numpy))
        return out

    def close(self) -> None:
        self.closed.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.endpoints.close()


class _ServicePipeline:
    """Ranges of steps in flight for one pass of iteration, consumed in step order (the Loader's pipeline interface)."""

    def __init__(self, remote: ServiceBatches, start: int):
        ld = remote.ld
        if start % ld.global_batch:  # a served step is a whole step: an elastic resume lands on step boundaries
            raise UsageError(f"served batches start on a step boundary: next_index {start} is not a multiple of "
                             f"global_batch {ld.global_batch}")
        self.remote, self.ld = remote, ld
        self.next_step = start // ld.global_batch
        self.sent = 0  # ranges asked for: the endpoint spread and the slow start
        self.ranges: collections.deque[Future] = collections.deque()
        self.ready: collections.deque[dict] = collections.deque()
        self._fill()

    def _fill(self) -> None:
        """Ranges in flight up to ``RANGES_IN_FLIGHT``: the first ones short (``FIRST_RANGE_STEPS``, doubled each
        range up to ``range_steps``), so a pass that reads a few steps (a validation, a short run, a resume that
        stops) is sent a few more, not two whole ranges; never past the loader's end (``stop_index``)."""
        ld, r = self.ld, self.remote
        while len(self.ranges) < RANGES_IN_FLIGHT:
            steps = min(r.range_steps, FIRST_RANGE_STEPS << min(self.sent, 16))
            if ld.stop_index is not None:
                steps = min(steps, (ld.stop_index - self.next_step * ld.global_batch) // ld.global_batch)
                if steps <= 0:
                    return
            req = r.request(self.next_step, steps)
            self.ranges.append(r.pool.submit(r.fetch, req, self.sent))
            self.next_step += steps
            self.sent += 1

    def next(self) -> tuple[dict, dict]:
        if not self.ready:
            self.ready.extend(self.ranges.popleft().result())
            self._fill()
        batch = self.ready.popleft()
        return batch, {"step": batch["step"], "cache_hits": 0, "cache_misses": 0, "bytes_downloaded": 0,
                       "service_bytes": self.remote.stats["bytes"], "service_retries": self.remote.stats["retries"]}

    def close(self) -> None:
        for fut in self.ranges:
            fut.cancel()
        self.ranges.clear()
        self.ready.clear()


def _rows(column: pa.FixedSizeListArray) -> np.ndarray:
    """A fixed-size-list column's values as a ``(rows, width)`` numpy view (no copy)."""
    return column.flatten().to_numpy().reshape(len(column), column.type.list_size)


def _split(x, rows: int) -> list:
    """``x``'s consecutive blocks of ``rows`` rows, as views (a torch tensor's or a numpy array's)."""
    if isinstance(x, np.ndarray):
        return np.split(x, range(rows, len(x), rows))
    return x.split(rows)


def range_steps(ld) -> int:
    """Steps a request: ``Source.service_steps_per_request``, lowered so a reply stays within ``RANGE_BYTES``
    (what the client holds stays bounded), the protocol's row bound and a server's default reply bound
    (``DEFAULT_MAX_REPLY_BYTES``); at least 1."""
    local = ld.global_batch // ld.world_size
    size = step_bytes(ld.manifest, local, bool(ld.batches.documents))
    fit = min(MAX_STEPS, MAX_ROWS // local, min(RANGE_BYTES, DEFAULT_MAX_REPLY_BYTES) // size)
    return max(1, min(ld.source.service_steps_per_request, fit))


def _older_server(e: Exception) -> str:
    """What a server from before protocol versions (it refuses the ``version`` field as unknown) needs."""
    if "unknown field 'version'" not in str(e):
        return ""
    return (f" (a gristmill serve older than this client: it speaks protocol 1, this client {PROTOCOL_VERSION}; "
            f"upgrade the server)")


def _refused(e: Exception) -> bool:
    """A refusal every endpoint would repeat: authentication, permission, a bad request."""
    return isinstance(e, (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError)) or (
        isinstance(e, flight.FlightServerError) and "bad request" in str(e))


HANDSHAKE_TRIES = 3


def handshake_hint(url: str, client_cert: bool) -> str:
    """What an endpoint that closes the socket before answering most likely wants of this client."""
    if url.startswith(("grpc://", "grpc+tcp://")):
        return " (a TLS server? use grpc+tls:// and service_tls_root)"
    if not client_cert:
        return " (a server that asks for a client certificate? set service_tls_cert and service_tls_key)"
    return " (does the server's --tls-client-ca sign service_tls_cert?)"


def reason(e: Exception, url: str, reached: bool, client_cert: bool = False) -> str:
    """A Flight error in one short line: gRPC's debug context dropped; a socket closed by an endpoint that never
    answered this client gets ``handshake_hint`` (one that answered before was just stopped)."""
    text = re.sub(r"^(Flight|gRPC) returned [\w ]+ error, with message: ", "", one_line(e)).split(". gRPC client debug context")[0]
    if "Socket closed" in text and not reached:
        text += handshake_hint(url, client_cert)
    return text


def client_id() -> str:
    """This client's identity for the server's per-client bounds: $GRISTMILL_CLIENT_ID, else the hostname (a
    pod's name: the ranks of one host share one bound, pods behind one NAT each have theirs)."""
    got = os.environ.get(CLIENT_ENV) or socket.gethostname()
    return got if CLIENT_ID.fullmatch(got) else re.sub(r"[^A-Za-z0-9_.:@/-]", "_", got)[:128] or "unknown"
