"""Hostile and malformed requests against a real ``gristmill serve`` (issue #31, docs/security.md
"Serving batches").

One server in its own process on 127.0.0.1 (``helpers.ServeProcess``), a bearer token required,
the default bounds (tests/test_service_admission.py tests the bounds, outages and idle streams). While every attack runs, a
well-behaved client (:class:`Guard`: a ``Loader`` with ``Source(service=...)``, rank 1 of 2) reads
its batches in a thread and checks each one against the same batches from the in-process
Loader (tokens and global indices); every test ends by waiting for a batch the guard verified
*after* the attack, and fails on any mismatch or error the guard saw.

Each attack asserts:

- the attacker's error is one line (no traceback, no newline) and names the problem;
- the server's RSS (``/proc/<pid>/status`` VmRSS) stays bounded: each cheap case is sent once
  (the allocator's first touch), then ``REPEATS`` times, and RSS may not grow by more than
  ``CHEAP_RSS_MB`` over the repeats: anything a refusal kept of 0.2 MB or more (an entry or a
  Loader opened for a bad request, a buffered ticket) fails it; seen: -0.7..+0.7 MB. The larger
  cases state their own bound where they run.
"""
from __future__ import annotations

import json
import random
import threading
import time
import types

import pyarrow as pa
import pyarrow.flight as flight
import pytest
import torch

from helpers import ServeProcess, build_synthetic
from gristmill.loader.service.protocol import PROTOCOL_VERSION

TOKEN = "hostile-test-token-7f3a"
AUTH = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())], timeout=30)
REPEATS = 20
CHEAP_RSS_MB = 4.0
# The well-behaved client: rank 1 of 2, global batch 8 over a 120-row train split (15 steps an epoch).
GOOD = dict(seed=3, global_batch=8, world_size=2, rank=1, order="global")
GOOD_STEPS = 24  # steps per pass of the guard: more than an epoch
PER_CLIENT = 8  # streams abandoned a round


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


class Guard:
    """The well-behaved client: passes of ``GOOD_STEPS`` steps through the service, each batch
    checked against the in-process Loader's, until stopped (or ``max_passes``)."""

    def __init__(self, url: str, data_url: str, reference: list[dict], max_passes: int = 10_000):
        self.url, self.data_url, self.reference, self.max_passes = url, data_url, reference, max_passes
        self.verified = 0
        self.last_ok = 0.0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guard", daemon=True)

    def _run(self):
        from gristmill.loader import Loader
        from gristmill.loader.options import Batches, Sampling, Source

        for _ in range(self.max_passes):
            if self._stop.is_set():
                return
            try:
                src = Source(service=(self.url,), service_token=TOKEN, service_timeout_s=20)
                with Loader(self.data_url, Sampling(**GOOD), source=src, batches=Batches(pin_memory=False)) as ld:
                    for i, batch in zip(range(GOOD_STEPS), ld):
                        want = self.reference[i]
                        if not (torch.equal(batch["indices"], want["indices"]) and torch.equal(batch["tokens"], want["tokens"])):
                            self.errors.append(f"pass batch {i}: differs from the in-process Loader's")
                        else:
                            self.verified += 1
                            self.last_ok = time.monotonic()
                        if self._stop.wait(0.01):  # a short simulated step, so the guard does not hog the 2 CPUs
                            return
            except Exception as e:  # noqa: BLE001 - any failure of the good client fails the test that runs
                self.errors.append(f"{type(e).__name__}: {e}")
                self._stop.wait(0.2)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=30)

    def check_after(self, t: float, timeout_s: float = 20.0) -> None:
        """No error so far, and a batch verified after monotonic time ``t`` (within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.last_ok <= t and time.monotonic() < deadline and not self.errors:
            time.sleep(0.02)
        assert not self.errors, f"the well-behaved client failed: {self.errors[:3]}"
        assert self.last_ok > t, f"the well-behaved client verified no batch in {timeout_s} s after the attack"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from gristmill.loader import Loader
    from gristmill.loader.options import Batches, Caching, Sampling

    root = tmp_path_factory.mktemp("hostile")
    pub = build_synthetic(str(root / "data"), seq_len=16, shard_rows=(40, 30, 50), tokens="marked")
    with Loader(pub.url, Sampling(**GOOD), caching=Caching(dir=str(root / "ref-cache")),
                batches=Batches(pin_memory=False)) as ld:
        reference = [b for _, b in zip(range(GOOD_STEPS), ld)]
    srv = ServeProcess(str(root / "data" / "store"), args=("--cache-dir", str(root / "serve-cache")),
                       env={"GRISTMILL_SERVE_TOKEN": TOKEN})
    assert srv.url, f"gristmill serve did not start: {srv.output()[-2000:]}"
    guard = Guard(srv.url, pub.url, reference).start()
    try:
        guard.check_after(time.monotonic(), timeout_s=60)  # warm: a Loader open on the server, the guard reading
        yield types.SimpleNamespace(url=srv.url, pid=srv.proc.pid, sha=pub.manifest.sha256, guard=guard, srv=srv,
                                    store=str(root / "data" / "store"), data_url=pub.url, manifest=pub.manifest,
                                    reference=reference)
        guard.check_after(time.monotonic())
    finally:
        guard.stop()
        srv.kill()


def client(served) -> flight.FlightClient:
    return flight.FlightClient(served.url)


def ticket(served, **fields) -> bytes:
    return json.dumps({"manifest_sha256": served.sha, "version": PROTOCOL_VERSION, **fields}).encode()


def refused(call, expect: str, kind=flight.FlightError) -> str:
    """The error ``call()`` raises: of ``kind``, one line, naming ``expect``."""
    with pytest.raises(kind) as info:
        call()
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text, f"a multi-line error: {text[:600]!r}"
    assert expect in text, f"the error does not name {expect!r}: {text[:300]!r}"
    return text


def get_all(c: flight.FlightClient, raw: bytes):
    return c.do_get(flight.Ticket(raw), AUTH).read_all()


def attack(served, send, *, repeats: int = REPEATS, rss_bound_mb: float = CHEAP_RSS_MB, warmup: int = 1) -> None:
    """``send()`` ``warmup`` times (the allocator's first touch: glibc keeps freed arenas of the
    gRPC threads), then ``repeats`` times: RSS growth over the repeats under ``rss_bound_mb``;
    the guard unaffected during and after."""
    t0 = time.monotonic()
    for _ in range(warmup):
        send()
    before = rss_mb(served.pid)
    for _ in range(repeats):
        send()
    grown = rss_mb(served.pid) - before
    print(f"RSS {before:.1f} MB, {grown:+.1f} MB over {repeats} repeats")
    assert grown < rss_bound_mb, f"server RSS grew {grown:.1f} MB over {repeats} repeats (bound {rss_bound_mb} MB)"
    served.guard.check_after(max(t0, time.monotonic() - 0.001))


# A 10 MB request is refused by gRPC from its length prefix (the server caps a request message at 8 KiB,
# loader/service/wire.py MAX_REQUEST_BYTES), before its body is buffered: nothing of it reaches the server's
# code. What gRPC reads of it before the reset (its HTTP/2 window) is freed, but glibc's arenas of the gRPC
# threads keep some (seen: +11..19 MB over the first 20, a plateau of +30..40 MB by 70; Flight's own server
# buffered each whole, 3 copies). The bound: 20 repeats grow RSS less than 32 MB (one kept copy a repeat: 200).
BIG_WARMUP, BIG_REPEATS = 6, 20
BIG_RSS_MB = 32.0
TOO_LARGE = "Received message larger than max"  # gRPC's refusal of a request over the cap


# -- malformed tickets: (id, fields or raw bytes, what the error must name) ----------------------------------------
_BAD = [
    ("unknown-hash", {"manifest_sha256": "0" * 64}, "unknown manifest"),
    ("non-hex-hash", {"manifest_sha256": "z" * 64}, "manifest_sha256"),
    ("uppercase-hash", {"manifest_sha256": "A" * 64}, "manifest_sha256"),
    ("short-hash", {"manifest_sha256": "a" * 63}, "manifest_sha256"),
    ("path-hash", {"manifest_sha256": "../../etc/passwd"}, "manifest_sha256"),
    ("url-hash", {"manifest_sha256": "s3://bucket/store/x/v1"}, "manifest_sha256"),
    ("negative-start-step", {"start_step": -1}, "start_step"),
    ("huge-start-step", {"start_step": 1 << 41}, "start_step"),
    # the largest start_step with the largest global batch: its first index is 2^64, past int64
    ("start-step-times-batch-overflows", {"start_step": 1 << 40, "global_batch": 1 << 24, "world_size": 1 << 24},
     "start_step"),
    ("zero-steps", {"steps": 0}, "steps"),
    ("negative-steps", {"steps": -5}, "steps"),
    ("steps-over-bound", {"steps": 1025}, "steps"),
    ("rows-over-bound", {"steps": 1024, "global_batch": 2048}, "rows"),
    ("zero-batch", {"global_batch": 0}, "global_batch"),
    ("negative-batch", {"global_batch": -8}, "global_batch"),
    ("huge-batch", {"global_batch": (1 << 24) + 1}, "global_batch"),
    ("batch-rows-over-bound", {"global_batch": 1 << 24}, "rows"),
    ("zero-world", {"world_size": 0}, "world_size"),
    ("rank-equals-world", {"rank": 2, "world_size": 2}, "rank"),
    ("rank-negative", {"rank": -1, "world_size": 2}, "rank"),
    ("not-divisible", {"global_batch": 10, "world_size": 4}, "divisible"),
    ("unknown-field", {"evil": 1}, "unknown field"),
    ("unknown-long-field", {"x" * 3000: 1}, "unknown field"),
    ("missing-hash", {"manifest_sha256": None, "_drop": "manifest_sha256"}, "manifest_sha256: missing"),
    # a client from before protocol versions (a record batch a step), and one of another version
    ("missing-version", {"_drop": "version"}, "version: missing: a client older than this server"),
    ("version-1", {"version": 1}, f"version: protocol 1, this server speaks protocol {PROTOCOL_VERSION}"),
    ("version-string", {"version": "2"}, "version: expected int"),
    ("steps-string", {"steps": "5"}, "steps: expected int"),
    ("steps-float", {"steps": 5.0}, "steps: expected int"),
    ("steps-bool", {"steps": True}, "steps: expected int"),
    ("documents-int", {"documents": 1}, "documents: expected bool"),
    ("hash-null", {"manifest_sha256": None}, "manifest_sha256: expected str"),
    ("seed-nan", {"seed": float("nan")}, "seed: expected int"),
    ("seed-over-int64", {"seed": 1 << 64}, "seed"),
    ("split-path", {"split": "../../etc/passwd"}, "split"),
    ("order-unknown", {"order": "random" * 20}, "order"),
    ("window-zero", {"window_shards": 0}, "window_shards"),
    ("json-array", b"[]", "not an object"),
    ("json-null", b"null", "not an object"),
    ("json-string", b'"' + b"a" * 100 + b'"', "not an object"),
    ("nested-array", b"[" * 2000 + b"]" * 2000, "bad request"),
    ("nested-in-field", b'{"steps": ' + b"[" * 1500 + b"]" * 1500 + b"}", "bad request"),
    ("ten-mb-ticket", b"{" + b" " * (10 << 20) + b"}", TOO_LARGE),
    ("five-kb-ticket", b"{" + b" " * 5000 + b"}", "ticket of"),
    ("random-bytes", random.Random(31).randbytes(2048), "not a JSON request"),
    ("nul-bytes", b"\x00" * 512, "not a JSON request"),
    ("invalid-utf8", b'{"manifest_sha256": "\xff\xfe\xfd"}', "not a JSON request"),
    ("empty-ticket", b"", "not a JSON request"),
]


def _raw(served, spec) -> bytes:
    if isinstance(spec, bytes):
        return spec
    fields = {"manifest_sha256": served.sha, "version": PROTOCOL_VERSION, **spec}
    drop = fields.pop("_drop", None)
    if drop:
        fields.pop(drop)
    return json.dumps(fields).encode()


@pytest.mark.parametrize("spec, expect", [pytest.param(s, e, id=i) for i, s, e in _BAD])
def test_malformed_ticket_is_one_line_and_bounded(served, spec, expect):
    c, raw = client(served), _raw(served, spec)
    big = len(raw) > 1 << 20
    try:
        if big:  # refused by gRPC (RESOURCE_EXHAUSTED: pyarrow's ArrowInvalid), not by the server's code
            attack(served, lambda: refused(lambda: get_all(c, raw), expect, pa.ArrowInvalid), warmup=BIG_WARMUP,
                   repeats=BIG_REPEATS, rss_bound_mb=BIG_RSS_MB)
        else:
            attack(served, lambda: refused(lambda: get_all(c, raw), expect))
    finally:
        c.close()


def test_a_refused_request_leaves_no_slot_taken(served):
    """Hundreds of refusals from one host, then the host still gets its streams (slots are not leaked
    by refusals before a stream starts)."""
    c = client(served)
    try:
        for _ in range(3 * PER_CLIENT):
            refused(lambda: get_all(c, ticket(served, manifest_sha256="0" * 64)), "unknown manifest")
            refused(lambda: get_all(c, ticket(served, steps=0)), "steps")
        table = get_all(c, ticket(served, **GOOD, steps=2))
        assert table.num_rows == 2 * GOOD["global_batch"] // GOOD["world_size"]
        assert table.column("indices").to_pylist()[:4] == served.guard.reference[0]["indices"].tolist()
    finally:
        c.close()


def test_unknown_hashes_rescan_the_stores_at_most_once_an_interval(served):
    """100 distinct unknown hashes: each one line; the store listing is rate-limited (--rescan-interval-s
    2.0), so they take well under the 100 listings they would cost otherwise."""
    c = client(served)
    rng = random.Random(7)
    t0 = time.monotonic()
    try:
        attack(served, lambda: refused(lambda: get_all(c, ticket(served, manifest_sha256=rng.randbytes(32).hex())),
                                       "unknown manifest"), repeats=99)
    finally:
        c.close()
    assert time.monotonic() - t0 < 10


# -- actions ---------------------------------------------------------------------------------------------------------
def action(c, kind: str, body: bytes, options=AUTH) -> list[bytes]:
    return [r.body.to_pybytes() for r in c.do_action(flight.Action(kind, body), options)]


@pytest.mark.parametrize("kind, body, expect", [
    pytest.param("delete", b"", "unknown action", id="unknown-action"),
    pytest.param("x" * 5000, b"", "unknown action", id="unknown-long-action"),
    pytest.param("manifest", b'{"name": "../../etc/passwd"}', "unknown dataset or mixture", id="name-path"),
    pytest.param("manifest", b'{"name": "s3://other-bucket/store/web"}', "unknown dataset or mixture", id="name-s3-url"),
    pytest.param("manifest", b'{"name": "synthetic/../../.."}', "unknown dataset or mixture", id="name-dotdot"),
    pytest.param("manifest", b'{"name": "/etc/passwd"}', "unknown dataset or mixture", id="name-absolute"),
    pytest.param("manifest", b'{"sha256": "../../etc/passwd"}', "sha256", id="sha-path"),
    pytest.param("manifest", b'{"sha256": "' + b"0" * 64 + b'"}', "unknown manifest", id="sha-unknown"),
    pytest.param("manifest", b'{"name": "synthetic", "sha256": "x"}', "the manifest action takes", id="two-keys"),
    pytest.param("manifest", b'{"name": 5}', "the manifest action takes", id="name-int"),
    pytest.param("manifest", b"\xff\xfe" * 100, "the manifest action takes", id="invalid-utf8"),
    pytest.param("manifest", b"{" + b" " * (10 << 20) + b"}", TOO_LARGE, id="ten-mb-body"),
    pytest.param("manifest", b"[" * 2000 + b"]" * 2000, "the manifest action takes", id="nested-body"),
])
def test_malformed_action_is_one_line_and_bounded(served, kind, body, expect):
    c = client(served)
    big = len(body) > 1 << 20
    try:
        if big:
            attack(served, lambda: refused(lambda: action(c, kind, body), expect, pa.ArrowInvalid), warmup=BIG_WARMUP,
                   repeats=BIG_REPEATS, rss_bound_mb=BIG_RSS_MB)
        else:
            attack(served, lambda: refused(lambda: action(c, kind, body), expect))
    finally:
        c.close()


def test_manifest_action_serves_a_known_name_only(served):
    c = client(served)
    try:
        reply = json.loads(action(c, "manifest", b'{"name": "synthetic"}')[0])
    finally:
        c.close()
    assert json.loads(reply["manifest"])["sha256"] == served.sha and reply["components"] == []


# -- authentication ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("header, expect", [
    pytest.param(None, "no bearer token", id="no-token"),
    pytest.param(b"Bearer wrong", "wrong bearer token", id="wrong-token"),
    pytest.param(f"Bearer {TOKEN[:-1]}".encode(), "wrong bearer token", id="token-prefix"),
    pytest.param(f"Bearer {TOKEN}x".encode(), "wrong bearer token", id="token-longer"),
    pytest.param(f"Basic {TOKEN}".encode(), "wrong bearer token", id="basic-scheme"),
    pytest.param(TOKEN.encode(), "wrong bearer token", id="no-scheme"),
])
def test_every_call_needs_the_token(served, header, expect):
    opts = flight.FlightCallOptions(headers=[(b"authorization", header)] if header else [], timeout=10)
    c = client(served)
    try:
        def send():
            refused(lambda: c.do_get(flight.Ticket(ticket(served, **GOOD)), opts).read_all(), expect,
                    flight.FlightUnauthenticatedError)
            refused(lambda: action(c, "stats", b"", opts), expect, flight.FlightUnauthenticatedError)
            refused(lambda: list(c.list_actions(opts)), expect, flight.FlightUnauthenticatedError)
        attack(served, send)
    finally:
        c.close()


def test_a_ten_mb_ticket_without_a_token_is_refused_and_not_kept(served):
    """An unauthenticated 10 MB ticket is refused by gRPC from its length prefix, before authentication or any
    buffering (docs/security.md); tests/test_service_admission.py sends 1 GiB."""
    c = client(served)
    raw = b"x" * (10 << 20)
    try:
        attack(served, lambda: refused(lambda: c.do_get(flight.Ticket(raw)).read_all(), TOO_LARGE, pa.ArrowInvalid),
               warmup=BIG_WARMUP, repeats=BIG_REPEATS, rss_bound_mb=BIG_RSS_MB)
    finally:
        c.close()


def test_loader_with_a_wrong_token_fails_in_one_line(served):
    from gristmill.loader import Loader
    from gristmill.loader.options import Batches, Sampling, Source
    from gristmill.loader.service.client import ServiceError

    src = Source(service=(served.url,), service_token="not-the-token", retries=1)
    with Loader(served.guard.data_url, Sampling(**GOOD), source=src, batches=Batches(pin_memory=False)) as ld:
        refused(lambda: next(iter(ld)), "wrong bearer token", ServiceError)


# -- streams -----------------------------------------------------------------------------------------------------------
def stats(served) -> dict:
    c = client(served)
    try:
        return json.loads(action(c, "stats", b"")[0])
    finally:
        c.close()


def wait_streams_at_most(served, n: int, timeout_s: float = 15.0) -> int:
    """Active streams (the guard's two ranges in flight included) down to ``n`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (active := stats(served)["active_streams"]) > n and time.monotonic() < deadline:
        time.sleep(0.05)
    return active


LONG = dict(global_batch=1024, steps=1024)  # 1M rows of 34 bytes: a stream the client has to read to end


def test_streams_abandoned_halfway_free_their_slots(served):
    """3 x PER_CLIENT streams read one batch each, then dropped (client closed, or the reader
    cancelled): if a dropped stream kept its slot this host would be refused after PER_CLIENT of
    them. RSS: a dropped stream's state (a record batch of 35 KB, its generator) must not stay."""
    def abandon_one(i):
        c = client(served)
        reader = c.do_get(flight.Ticket(ticket(served, **LONG, start_step=i)), AUTH)
        chunk = reader.read_chunk()
        assert chunk.data.num_rows == 1024
        if i % 2:
            reader.cancel()
        c.close()

    counter = iter(range(10_000))
    attack(served, lambda: [abandon_one(next(counter)) for _ in range(PER_CLIENT)], repeats=3, rss_bound_mb=12.0)
    active = wait_streams_at_most(served, 2)
    assert active <= 2, f"{active} streams still active after abandoned ones (the guard holds at most 2)"


def test_a_flood_of_unread_streams_holds_little_memory(served):
    """4 x PER_CLIENT streams opened at once by one client and not read (the defaults serve them all): each
    holds at most its gRPC window and one assembled chunk, not its 36 MB; cancelling them frees the slots.
    The guard, on the same host, still gets every batch meanwhile."""
    c = client(served)
    readers = []
    t0 = time.monotonic()
    before = rss_mb(served.pid)
    try:
        for i in range(4 * PER_CLIENT):
            readers.append(c.do_get(flight.Ticket(ticket(served, **LONG, start_step=i)), AUTH))
        served.guard.check_after(time.monotonic())
        grown = rss_mb(served.pid) - before
        print(f"RSS {before:.1f} MB, {grown:+.1f} MB")
        assert grown < 128, f"RSS grew {grown:.1f} MB with {len(readers)} unread streams"
    finally:
        for r in readers:
            r.cancel()
        c.close()
    assert wait_streams_at_most(served, 2) <= 2
    served.guard.check_after(t0)


def test_200_idle_connections(served):
    """200 Flight clients, each connected (one list_actions) then idle: the server answers the
    guard meanwhile; RSS per idle connection < 256 KB (a gRPC transport's buffers, no thread)."""
    before = rss_mb(served.pid)
    t0 = time.monotonic()
    clients = []
    try:
        for _ in range(200):
            c = client(served)
            clients.append(c)
            assert [a.type for a in c.list_actions(AUTH)] == ["stats", "manifest"]
        served.guard.check_after(time.monotonic())
        grown = rss_mb(served.pid) - before
        print(f"RSS {before:.1f} MB, {grown:+.1f} MB")
        assert grown < 200 * 0.25, f"RSS grew {grown:.1f} MB with 200 idle connections"
        assert stats(served)["active_streams"] <= 2
    finally:
        for c in clients:
            c.close()
    served.guard.check_after(t0)


def test_a_request_at_the_row_bound_is_served_and_its_memory_returned(served):
    """The largest request the bounds allow here (2^20 rows of 17 uint16 tokens: one 44 MB record
    batch) is served whole, equal to the in-process rows; after it the RSS is back within 2 x
    its size (the batch, the gather's plan and gRPC's copy are freed, not kept per request)."""
    c = client(served)
    try:
        before = rss_mb(served.pid)
        table = get_all(c, ticket(served, global_batch=1 << 20, steps=1))
        assert table.num_rows == 1 << 20
        first = table.column("indices").to_pylist()[:3]
        assert first == [0, 1, 2]
        del table
        time.sleep(0.5)
        grown = rss_mb(served.pid) - before
        print(f"RSS {before:.1f} MB, {grown:+.1f} MB")
    finally:
        c.close()
    assert grown < 2 * 44, f"RSS grew {grown:.1f} MB after one 44 MB request"
    served.guard.check_after(time.monotonic())


def test_a_reply_over_the_byte_bound_is_refused_before_any_work(served, tmp_path):
    """A server with ``--max-reply-bytes`` of 5 steps of the good client's rows: 6 steps is a one-line
    ``bad request`` naming the bound and the fix, no slot kept; 5 steps are served. A Loader asking
    more steps a request than that server allows fails at once (not retried); one asking fewer reads
    the in-process batches, bit for bit."""
    from gristmill.loader import Loader
    from gristmill.loader.options import Batches, Sampling, Source
    from gristmill.loader.service.client import ServiceError
    from gristmill.loader.service.protocol import step_bytes

    local = GOOD["global_batch"] // GOOD["world_size"]
    bound = 5 * step_bytes(served.manifest, local, False)
    with ServeProcess(served.store, args=("--cache-dir", str(tmp_path / "c"), "--max-reply-bytes", str(bound)),
                      env={"GRISTMILL_SERVE_TOKEN": TOKEN}) as small:
        assert small.url, small.output()
        c = flight.FlightClient(small.url)
        try:
            for _ in range(3):
                text = refused(lambda: get_all(c, ticket(served, **GOOD, steps=6)), "--max-reply-bytes")
                assert "bad request" in text and f"bound of {bound} bytes" in text and "fewer steps" in text, text
            assert get_all(c, ticket(served, **GOOD, steps=5)).num_rows == 5 * local
            st = json.loads(action(c, "stats", b"")[0])
            assert st["refused"] == 3 and st["requests"] == 1 and st["active_streams"] == 0, st
        finally:
            c.close()

        def read(steps_per_request: int) -> list[dict]:
            src = Source(service=(small.url,), service_token=TOKEN, service_steps_per_request=steps_per_request,
                         retries=3, backoff_s=0.05)
            with Loader(served.data_url, Sampling(**GOOD), source=src, batches=Batches(pin_memory=False)) as ld:
                return [b for _, b in zip(range(GOOD_STEPS), ld)]

        t = time.monotonic()
        with pytest.raises(ServiceError, match="--max-reply-bytes") as info:
            read(16)
        assert time.monotonic() - t < 10 and "\n" not in str(info.value)
        for i, batch in enumerate(read(5)):
            want = served.reference[i]
            assert torch.equal(batch["indices"], want["indices"]) and torch.equal(batch["tokens"], want["tokens"]), i
    served.guard.check_after(time.monotonic())


def test_the_client_never_asks_more_than_the_default_reply_bound():
    """``service_steps_per_request`` is lowered to what fits the client's range bound (RANGE_BYTES), the
    default reply bound and the row bound."""
    from gristmill.loader.service.client import RANGE_BYTES, range_steps
    from gristmill.loader.service.protocol import DEFAULT_MAX_REPLY_BYTES, MAX_ROWS, step_bytes

    def ld(seq_len, global_batch, world_size=1, steps=16, documents=False, dtype="uint32"):
        m = types.SimpleNamespace(seq_len=seq_len, row_tokens=seq_len + 1, token_dtype=dtype)
        return types.SimpleNamespace(manifest=m, global_batch=global_batch, world_size=world_size,
                                     batches=types.SimpleNamespace(documents=documents),
                                     source=types.SimpleNamespace(service_steps_per_request=steps))

    assert range_steps(ld(2048, 64)) == 16  # 16 x 64 rows x 8 KB: 8.4 MB
    for case in (ld(2048, 4096), ld(2048, 4096, documents=True), ld(8192, 1024, steps=1024), ld(16, 1 << 20),
                 ld(1 << 20, 256)):
        n = range_steps(case)
        local = case.global_batch // case.world_size
        assert n >= 1 and n * local <= MAX_ROWS
        assert n == 1 or n * step_bytes(case.manifest, local, case.batches.documents) <= RANGE_BYTES < DEFAULT_MAX_REPLY_BYTES
    assert range_steps(ld(2048, 64, steps=64)) == 31  # 64 rows x 8,204 bytes: 525,056 a step, 31 in 16 MiB
    assert range_steps(ld(2048, 4096)) == 1  # 4096 rows x 8,204 bytes: 33.6 MB a step, over 16 MiB: one a request
