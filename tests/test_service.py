"""`gristmill serve` (issue 31): batches over Arrow Flight equal the in-process Loader's bit for bit
(a dataset, a mixture with documents, two endpoints, 4 ranks), survive the kill -9 of a server,
refuse missing or wrong tokens, serve over TLS, and find a version published after the start.
Servers run in their own processes (helpers.ServeProcess)."""
from __future__ import annotations

import datetime
import ipaddress
import json
import re
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow.flight as flight
import pytest
import torch
import yaml

from helpers import ServeProcess, build_dataset
from gristmill.cli import main
from gristmill.loader import Batches, Caching, Loader, Sampling, Source
from gristmill.loader.service.client import ServiceError
from gristmill.manifests.synthetic import build_synthetic

B, W = 8, 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A dataset ("toy") and a mixture ("blend", of two datasets with several documents a row) in one store."""
    root = tmp_path_factory.mktemp("serve")
    toy = build_dataset(str(root))
    for name, seed in (("web", 1), ("code", 2)):
        build_synthetic(str(root), dataset=name, shard_rows=(24, 16), val_rows=(8,), seed=seed, doc_tokens=(3, 9))
    job = root / "mix.yaml"
    job.write_text(yaml.safe_dump({"name": "blend", "store": str(root / "store"), "components": [
        {"dataset": "web", "weight": 3}, {"dataset": "code", "weight": 1}]}))
    assert main(["mix", str(job)]) == 0
    return {"root": root, "store": str(root / "store"), "toy": toy.url, "blend": str(root / "store" / "blend")}


@pytest.fixture(scope="module")
def two_servers(data):
    servers = [ServeProcess(data["store"], args=("--cache-dir", str(data["root"] / f"cache-{i}"))) for i in range(2)]
    yield servers
    for s in servers:
        s.kill()


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == b[k].dtype and v.shape == b[k].shape and torch.equal(v, b[k]), k
        else:
            assert v == b[k], k


def loaders(url, cache, endpoints=(), *, documents=False, token_dtype=torch.int64, **source):
    return [Loader(url, Sampling(global_batch=B, rank=r, world_size=W, seed=3), caching=Caching(dir=str(cache)),
                   source=Source(service=tuple(endpoints), **source),
                   batches=Batches(documents=documents, token_dtype=token_dtype)) for r in range(W)]


def take(ld: Loader, steps: int) -> list[dict]:
    out = []
    for batch in ld:
        out.append(batch)
        if len(out) == steps:
            return out
    return out


@pytest.mark.parametrize("which, documents, token_dtype", [("toy", False, torch.int64), ("blend", True, None)])
def test_served_batches_are_the_in_process_batches_bit_for_bit(data, two_servers, tmp_path, which, documents,
                                                               token_dtype):
    endpoints = [s.url for s in two_servers]
    refs = loaders(data[which], tmp_path / "ref", documents=documents, token_dtype=token_dtype)
    served = loaders(data[which], tmp_path / "unused", endpoints, documents=documents, token_dtype=token_dtype)
    for ref, srv in zip(refs, served):
        want, got = take(ref, 200), take(srv, 200)
        assert len(want) == len(got) == 200
        for a, b in zip(want, got):
            same(a, b)
        assert srv.state_dict() == ref.state_dict()
        ref.close(), srv.close()
    assert not os.path.exists(tmp_path / "unused")  # served: the client keeps no shard cache
    stats = [json.loads(next(iter(flight.FlightClient(u).do_action(flight.Action("stats", b"")))).body.to_pybytes())
             for u in endpoints]
    assert all(s["requests"] > 0 and s["active_streams"] == 0 for s in stats)  # both endpoints served ranges


def test_the_server_serves_without_torch(data, tmp_path):
    """Issue 41 target 5: `gristmill serve` never imports torch. Started where `import torch` fails (a torch
    package on PYTHONPATH that raises: a server image without torch), it starts and serves a mixture with
    documents (tokens in their stored dtype, position ids) bit for bit."""
    fake = tmp_path / "no-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("gristmill serve imported torch")\n')
    path = os.pathsep.join([str(fake.parent)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    server = ServeProcess(data["store"], args=("--cache-dir", str(tmp_path / "cache")), env={"PYTHONPATH": path})
    try:
        assert server.url, server.output()[-2000:]
        refs = loaders(data["blend"], tmp_path / "ref", documents=True, token_dtype=None)
        served = loaders(data["blend"], tmp_path / "unused", [server.url], documents=True, token_dtype=None)
        for ref, srv in zip(refs, served):
            want, got = take(ref, 20), take(srv, 20)
            assert len(want) == len(got) == 20
            for a, b in zip(want, got):
                same(a, b)
            ref.close(), srv.close()
        assert "imported torch" not in server.output()
    finally:
        server.kill()


def test_a_served_loader_asks_for_no_step_past_the_runs_end(data, tmp_path):
    """Loader.end_at (what the trainer sets to its run's end): a served rank that reads its run's 5 steps, past
    a resume at step 2, asks the service for those 5 steps and no more (it asks for ranges ahead), and ends."""
    server = ServeProcess(data["store"], args=("--cache-dir", str(tmp_path / "cache")))
    try:
        ref, served = (loaders(data["toy"], tmp_path / "ref")[1],
                       loaders(data["toy"], tmp_path / "unused", [server.url])[1])
        for ld in (ref, served):
            ld.load_state_dict({"next_index": 2 * B})
            ld.end_at(7 * B)
        want, got = list(ref), list(served)
        assert [b["step"] for b in got] == [b["step"] for b in want] == [2, 3, 4, 5, 6]
        for a, b in zip(want, got):
            same(a, b)
        ref.close(), served.close()
        stats = json.loads(next(iter(flight.FlightClient(server.url).do_action(flight.Action("stats", b"")))).body.to_pybytes())
        assert stats["steps"] == 5
    finally:
        server.kill()


def test_resume_from_a_state_dict_and_a_client_that_reads_only_the_service(data, two_servers, tmp_path):
    (ref,) = [Loader(data["blend"], Sampling(global_batch=B, seed=3), caching=Caching(dir=str(tmp_path)))]
    want = take(ref, 12)
    # the client reads no store: the manifest (and the mixture's components) come from the server, hash-checked
    sha = ref.manifest.sha256
    srv = Loader(sha, Sampling(global_batch=B, seed=3), source=Source(service=(two_servers[0].url,)))
    srv.load_state_dict({**ref.state_dict(), "next_index": 5 * B})
    for a, b in zip(want[5:], take(srv, 7)):
        same(a, b)
    ref.close(), srv.close()
    named = Loader("blend", Sampling(global_batch=B, seed=3), source=Source(service=(two_servers[1].url,)))
    assert named.manifest.sha256 == sha
    named.close()


def test_kill_9_of_one_server_mid_run_changes_no_batch(data, two_servers, tmp_path):
    # a is this test's own (it is killed); b, the one that answers after the kill, is a module server
    a, b = ServeProcess(data["store"], args=("--cache-dir", str(tmp_path / "c0"))), two_servers[0]
    try:
        refs = loaders(data["toy"], tmp_path / "ref")
        served = loaders(data["toy"], tmp_path / "x", [a.url, b.url], retries=3, backoff_s=0.05, service_timeout_s=10,
                         service_steps_per_request=8)  # short ranges: the run asks a's after the kill
        its = [iter(s) for s in served]
        got = [[] for _ in range(W)]
        for step in range(60):
            if step == 20:
                a.kill()  # kill -9: ranges in flight on it fail and are asked of b
            for r in range(W):
                got[r].append(next(its[r]))
        assert sum(s.remote.stats["retries"] for s in served) > 0  # ranges did fail over
        for r in range(W):
            for x, y in zip(take(refs[r], 60), got[r]):
                same(x, y)
            refs[r].close(), served[r].close()
    finally:
        a.kill()


def make_cert(tmp_path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def first_batch(url, endpoint, **source) -> dict:
    with Loader(url, Sampling(global_batch=B, seed=3), source=Source(service=(endpoint,), retries=1, backoff_s=0.01,
                                                                       service_timeout_s=10, **source)) as ld:
        return next(iter(ld))


def test_tokens_and_tls(data, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    cert, key = make_cert(tmp_path)
    with ServeProcess(data["store"], args=("--token-file", str(token), "--tls-cert", cert, "--tls-key", key,
                                           "--cache-dir", str(tmp_path / "c"))) as srv:
        assert srv.url.startswith("grpc+tls://")
        tls = srv.url.replace("127.0.0.1", "localhost")
        with Loader(data["toy"], Sampling(global_batch=B, seed=3), caching=Caching(dir=str(tmp_path / "ref"))) as ref:
            want = next(iter(ref))
        same(want, first_batch(data["toy"], tls, service_tls_root=cert, service_token="s3cret-token"))
        same(want, first_batch(data["toy"], tls, service_tls_root=cert, service_token_file=str(token)))
        with pytest.raises(ServiceError, match="no bearer token"):
            first_batch(data["toy"], tls, service_tls_root=cert)
        with pytest.raises(ServiceError, match="wrong bearer token"):
            first_batch(data["toy"], tls, service_tls_root=cert, service_token="guess")
        # mutual TLS: the server asks for a client certificate its --tls-client-ca signed
        with ServeProcess(data["store"], args=("--token-file", str(token), "--tls-cert", cert, "--tls-key", key,
                                               "--tls-client-ca", cert, "--cache-dir", str(tmp_path / "c"))) as mtls:
            url = mtls.url.replace("127.0.0.1", "localhost")
            same(want, first_batch(data["toy"], url, service_tls_root=cert, service_token_file=str(token),
                                   service_tls_cert=cert, service_tls_key=key))
            t = time.monotonic()
            with pytest.raises(ServiceError, match="client certificate"):  # none given
                first_batch(data["toy"], url, service_tls_root=cert, service_token_file=str(token))
            assert time.monotonic() - t < 60  # fails on its own, not at service_deadline_s (120 s)
        t = time.monotonic()
        with pytest.raises(ServiceError) as plain:  # a plain-text client against the TLS server
            first_batch(data["toy"], f"grpc://localhost:{srv.port}", service_token="s3cret-token")
        assert time.monotonic() - t < 60  # fails on its own, not at service_deadline_s (120 s)
        assert "\n" not in str(plain.value) and f"grpc://localhost:{srv.port}" in str(plain.value)
        assert "a TLS server? use grpc+tls://" in str(plain.value) and "debug context" not in str(plain.value)


def test_a_token_from_the_environment_and_no_token_beyond_loopback(data, tmp_path):
    with ServeProcess(data["store"], env={"GRISTMILL_SERVE_TOKEN": "envtok"},
                      args=("--cache-dir", str(tmp_path / "c"))) as srv:
        first_batch(data["toy"], srv.url, service_token="envtok")
        with pytest.raises(ServiceError, match="wrong bearer token"):
            first_batch(data["toy"], srv.url, service_token="other")
    env = {k: v for k, v in os.environ.items() if k != "GRISTMILL_SERVE_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "gristmill", "serve", data["store"], "--listen", "0.0.0.0:0"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "refusing to listen on 0.0.0.0 without a token" in out.stderr


def test_a_missing_tls_or_token_file_is_one_line_naming_its_flag(data, tmp_path):
    for flag in ("--tls-cert", "--tls-key", "--tls-client-ca", "--token-file"):
        missing = str(tmp_path / f"no{flag}.pem")
        out = subprocess.run([sys.executable, "-m", "gristmill", "serve", data["store"], flag, missing],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr  # was a FileNotFoundError traceback
        assert out.stderr.strip().count("\n") == 0 and f"{flag} {missing}: cannot read it" in out.stderr


def test_a_version_published_after_the_start_and_an_unknown_hash(data, tmp_path):
    root = tmp_path / "late"
    early = build_dataset(str(root))
    with ServeProcess(str(root / "store"), args=("--cache-dir", str(tmp_path / "c"), "--rescan-interval-s", "0",
                                                  "--max-open", "1")) as srv:  # one entry open: each switch evicts
        late = build_dataset(str(root), seed=7)  # toy v2, another hash
        with Loader(late.url, Sampling(global_batch=B, seed=3), caching=Caching(dir=str(tmp_path / "ref"))) as ref:
            same(next(iter(ref)), first_batch(late.url, srv.url))
        with pytest.raises(ServiceError, match="unknown manifest 0{64}"):
            Loader("0" * 64, source=Source(service=(srv.url,)))
        client = flight.FlightClient(srv.url)
        with pytest.raises(flight.FlightServerError, match="bad request: ticket is not a JSON request"):
            client.do_get(flight.Ticket(b"\xff\x00garbage")).read_all()
        with pytest.raises(flight.FlightServerError, match="unknown manifest"):
            client.do_get(flight.Ticket(json.dumps({"manifest_sha256": "1" * 64, "version": 2}).encode())).read_all()
        for pub in (early, late, early):  # the server keeps serving, evicting and reopening its one entry
            with Loader(pub.url, Sampling(global_batch=B, seed=3), caching=Caching(dir=str(tmp_path / "ref"))) as ref:
                same(next(iter(ref)), first_batch(pub.url, srv.url))
        stats = json.loads(next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes())
        assert stats["loaders_opened"] == 4 and stats["active_streams"] == 0, stats
        assert stats["refused_bad_request"] == 1 and stats["refused_unknown"] == 1, stats
        out = srv.stop()
    assert "SIGTERM, shutting down" in out
    # one line a client session (this host, two manifests), not a line a stream; refusals rate-limited per host
    assert out.count("session start: ") == 2 and out.count("session end: ") == 2, out
    assert not re.search(r"\d+ of \d+ steps", out), out  # the per-stream lines are DEBUG
    assert out.count(" (bad_request): ") + out.count(" (unknown): ") == 1, out
    assert "bad request: ticket is not a JSON request" in out, out


def test_the_trainer_reads_through_the_service_by_manifest_hash(data, two_servers, tmp_path, capsys):
    """data.service: the job names the data by hash only; training, validation and checkpoints run."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sha = Loader(data["toy"], caching=Caching(dir=str(tmp_path / "c"))).manifest.sha256
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "gristmill", "train", os.path.join(root, "configs", "train-tiny.yaml"),
           "--set", f"data.manifest={sha}", "--set", f"data.service=[{two_servers[0].url}, {two_servers[1].url}]",
           "--set", f"run.dir={run_dir}", "--set", "run.steps=2", "--set", "eval.every=2", "--set", "run.tensorboard=false",
           "--set", "data.global_batch=4", "--set", "run.log_samples=true"]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "val_loss" in out.stderr + out.stdout
    with Loader(data["toy"], Sampling(global_batch=4), caching=Caching(dir=str(tmp_path / "c"))) as ref:
        want = [b["indices"].tolist() for b in take(ref, 2)]
    logged = [json.loads(line) for line in open(run_dir / "samples.jsonl")]
    assert [x["indices"] for x in logged] == want, logged
    # The checkpoint names the data by the service's URL and hash: the audit says where to point it,
    # and given the version's URL in the store it answers, the hash still checked.
    # (in this process: the command's exit code and one line, as `gristmill audit` prints them; a process
    # start each cost ~2 s)
    audit = ["audit", "seen", str(run_dir)]
    capsys.readouterr()
    bare_rc, bare = main(audit), capsys.readouterr()
    assert bare_rc != 0 and "Traceback" not in bare.err, bare.err[-3000:]
    assert "fed by gristmill serve at grpc://" in bare.err and "--manifest" in bare.err, bare.err
    told_rc, told = main(audit + ["--manifest", data["toy"], "--json"]), capsys.readouterr()
    assert told_rc == 0, told.err[-3000:]
    assert json.loads(told.out)["manifest_sha256"] == sha


def test_a_stream_waiting_on_a_cold_shard_does_not_hold_up_one_reading_another(data, tmp_path):
    """The server's path, Loader.rows_at_many (a stream's, in its gRPC thread): while one stream's shard is
    being downloaded, another stream fetches and serves a different shard (one ensure of a shard at a time,
    not one of any shard)."""
    ld = Loader(data["toy"], Sampling(order="sequential"), caching=Caching(dir=str(tmp_path / "c")),
                batches=Batches(token_dtype=None, pin_memory=False))
    shard_of, row_of = ld.order.locate(np.arange(ld.order.num_samples))
    a, b = 0, int(np.argmax(shard_of != shard_of[0]))  # the first rows of two different shards
    slow, download = ld.shards[shard_of[a]].raw_sha256, ld.cache.fetcher.download
    fetching, release = threading.Event(), threading.Event()

    def gated(shard):  # shard a's download waits until released
        if shard.raw_sha256 == slow:
            fetching.set()
            assert release.wait(120)
        return download(shard)

    ld.cache.fetcher.download = gated
    got = {}

    def stream(i):
        got[i] = next(ld.rows_at_many([i], 1))[0]["tokens"][0, :2].tolist()

    first, second = (threading.Thread(target=stream, args=(i,), daemon=True) for i in (a, b))
    first.start()
    assert fetching.wait(60)
    second.start()
    second.join(60)
    served_meanwhile = not second.is_alive()
    release.set()
    first.join(60)
    ld.close()
    assert served_meanwhile, "the stream of another shard waited for shard a's download"
    for i in (a, b):  # row r of shard s starts with s + 1, r (helpers.build_dataset)
        assert got[i] == [int(shard_of[i]) + 1, int(row_of[i])]


def test_a_request_is_assembled_and_sent_in_groups_of_steps(data, tmp_path, monkeypatch):
    """The server's stream (in this process, no gRPC): steps assembled a group at a time (here 3 of rank 1's,
    so 10 steps are groups of 3, 3, 3, 1), each group one record batch (protocol 2) whose metadata names its
    steps and whose rows, step by step, are the in-process Loader's batches, document positions included."""
    from gristmill.loader.service import server as S
    from gristmill.loader.service.protocol import Request

    monkeypatch.setattr(S, "ASSEMBLE_ROWS", 3 * B // W)
    srv = S.GristmillServer(S.ServeConfig((data["store"],), port=0, cache_dir=str(tmp_path / "c")))
    try:
        ref = loaders(data["blend"], tmp_path / "ref", documents=True, token_dtype=None)[1]
        ref.load_state_dict({**ref.state_dict(), "next_index": 2 * B})
        want = take(ref, 10)
        req = Request(manifest_sha256=ref.manifest.sha256, seed=3, global_batch=B, rank=1, world_size=W, start_step=2,
                      steps=10, documents=True)
        stream = S._Stream(srv, srv._acquire(req), req, "here")
        srv.admission.enter("here", stream.cost)
        assert stream.steps_at_once == 3
        got = list(stream.record_batches())
        assert [json.loads(meta) for _, meta in got] == [{"first_step": s, "steps": n} for s, n in
                                                          ((2, 3), (5, 3), (8, 3), (11, 1))]
        assert srv.stats.snapshot(0)["steps"] == 10 and stream.bytes == 10 * stream.step_bytes
        local = B // W
        rows = {k: np.concatenate([rb.column(k).flatten().to_numpy().reshape(rb.num_rows, -1) for rb, _ in got])
                for k in ("tokens", "position_ids")}
        indices = np.concatenate([rb.column("indices").to_numpy() for rb, _ in got])
        for k, w in enumerate(want):
            part = slice(k * local, (k + 1) * local)
            assert np.array_equal(indices[part], w["indices"].numpy())
            assert rows["tokens"].dtype == w["tokens"].numpy().dtype
            assert np.array_equal(rows["tokens"][part], w["tokens"].numpy())
            assert np.array_equal(rows["position_ids"][part], w["position_ids"].numpy())
        ref.close()
    finally:
        srv.shutdown()


def _groups(rb, local: int):
    """A record batch's rows as a list of its steps' (each ``local`` rows)."""
    return [rb.slice(k, local) for k in range(0, rb.num_rows, local)]


def _group(steps, first: int):
    """Steps' record batches as one group record batch of protocol 2, with its metadata."""
    import pyarrow as pa
    from gristmill.loader.service.protocol import group_metadata

    return pa.Table.from_batches(steps).combine_chunks().to_batches()[0], group_metadata(first, len(steps))


# (name, tamper(list of (record batch, metadata)) -> the same, what the client says). Each group holds 2 steps of
# 2 rows (local batch); the reply asks steps 1..6.
_TAMPERED = [
    ("groups-swapped", lambda g: [g[1], g[0], g[2]], "expected the group of steps from 1"),
    ("a-group-missing", lambda g: [g[0], g[2]], "expected the group of steps from 3"),
    ("the-last-group-missing", lambda g: g[:2], "stream ended at step 5, before step 6"),
    ("a-group-repeated", lambda g: [g[0], g[0], g[1], g[2]], "expected the group of steps from 3"),
    ("a-group-too-many", lambda g: [*g, g[2]], "more than the 6 steps"),
    ("steps-swapped-inside-a-group", lambda g: [g[0], _group(_groups(g[1][0], 2)[::-1], 3), g[2]],
     "step 3: the rows' global indices are not 28..29"),
    ("a-step-of-another-group", lambda g: [g[0], _group(_groups(g[0][0], 2), 3), g[2]],
     "step 3: the rows' global indices are not 28..29"),
    ("rows-swapped-inside-a-step", lambda g: [g[0], g[1], (g[2][0].take([1, 0, 2, 3]), g[2][1])],
     "step 5: the rows' global indices are not 44..45"),
    ("half-a-step", lambda g: [(g[0][0].slice(0, 3), g[0][1]), g[1], g[2]], "with 3 rows"),
    ("metadata-of-fewer-steps", lambda g: [(g[0][0], b'{"first_step": 1, "steps": 1}'), g[1], g[2]],
     "with 4 rows, expected the group of steps from 1"),
    ("metadata-of-protocol-1", lambda g: [(g[0][0], b'{"step": 1}'), g[1], g[2]], "got b'{\"step\": 1}'"),
]


@pytest.fixture(scope="module")
def tampering(data, tmp_path_factory):
    """A Flight server answering a request with the real server's record batches (GristmillServer's _Stream, in
    this process) in groups of 2 steps, passed through ``server.tamper`` first."""
    import pyarrow as pa
    from gristmill.loader.service import server as S
    from gristmill.loader.service.protocol import Request

    real = S.GristmillServer(S.ServeConfig((data["store"],), port=0,
                                           cache_dir=str(tmp_path_factory.mktemp("tamper") / "c")))

    class Tampering(flight.FlightServerBase):
        tamper = staticmethod(lambda groups: groups)

        def do_get(self, context, ticket):
            req = Request.decode(ticket.ticket)
            stream = S._Stream(real, real._acquire(req), req, "tamper")
            stream.steps_at_once = 2
            real.admission.enter("tamper", stream.cost)
            groups = [(rb, meta) for rb, meta in stream.record_batches()]
            stream.finish("done")
            return flight.GeneratorStream(stream.schema, [(rb, pa.py_buffer(m)) for rb, m in self.tamper(groups)])

    server = Tampering("grpc://127.0.0.1:0")
    threading.Thread(target=server.serve, daemon=True).start()
    yield server
    server.shutdown()
    real.shutdown()


@pytest.mark.parametrize("tamper, expect", [pytest.param(t, e, id=i) for i, t, e in _TAMPERED])
def test_a_reply_with_steps_out_of_order_missing_or_partial_is_refused(data, tampering, tmp_path, tamper, expect):
    """Protocol 2 (a record batch a group of steps): the client refuses any reply whose groups or rows are not the
    steps it asked for, in order, each whole, and names the first that is not (it then asks another endpoint);
    the same reply untampered is the in-process Loader's batches."""
    from gristmill.loader.service.client import ReplyMismatch

    ld = loaders(data["toy"], tmp_path / "c", [f"grpc://127.0.0.1:{tampering.port}"])[2]
    ref = loaders(data["toy"], tmp_path / "ref")[2]
    try:
        req = ld.remote.request(1, 6)
        url = ld.remote.endpoints.urls[0]
        tampering.tamper = staticmethod(lambda groups: groups)
        got, _ = ld.remote._get(url, req)
        want = take(ref, 7)[1:]
        assert len(got) == 6
        for g, w in zip(got, want):
            same(g, w)
        tampering.tamper = staticmethod(tamper)
        with pytest.raises(ReplyMismatch) as info:
            ld.remote._get(url, req)
        assert expect in str(info.value) and "\n" not in str(info.value), str(info.value)
    finally:
        ld.close()
        ref.close()


def test_a_server_of_protocol_1_is_named_in_one_line(data, tmp_path):
    """A gristmill serve from before protocol versions refuses the client's ``version`` field as unknown: the client
    fails at once, in one line, saying to upgrade the server (a reply in the old framing is never read)."""
    class OldServer(flight.FlightServerBase):
        def do_get(self, context, ticket):
            raise flight.FlightServerError("bad request: unknown field 'version'; fields: documents, global_batch, "
                                           "manifest_sha256, order, rank, seed, split, start_step, steps, "
                                           "window_shards, world_size")

    old = OldServer("grpc://127.0.0.1:0")
    threading.Thread(target=old.serve, daemon=True).start()
    try:
        ld = loaders(data["toy"], tmp_path / "c", [f"grpc://127.0.0.1:{old.port}"], service_deadline_s=30.0)[0]
        t = time.monotonic()
        with pytest.raises(ServiceError) as info:
            next(iter(ld))
        text = str(info.value)
        assert "unknown field 'version'" in text and "older than this client" in text and "upgrade the server" in text
        assert "\n" not in text and time.monotonic() - t < 10
        ld.close()
    finally:
        old.shutdown()
