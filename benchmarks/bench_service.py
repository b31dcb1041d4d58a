"""``gristmill serve``'s targets (issue #31), measured in one run (docs/benchmarks.md "Serving batches").

1. Throughput, warm cache, seq_len 2048, one server process: sequences served per server
   CPU-second (``/proc/<pid>/stat`` utime + stime over the timed requests) against the in-process
   Loader's sequences per CPU-second of its own process (``os.times``) on the same data, order
   and batch. Target: >= 0.5x. Beside it, why: the server's request path run here without gRPC
   (as built, and planning a request's steps in one call), and Arrow Flight alone (a minimal
   server streaming pre-built batches of the same shape).
2. Load: R client ranks as separate processes (forked from a preloaded fork server, so 128
   of them start in seconds), each a Loader with ``Source(service=...)`` and a simulated 200 ms
   step, on one server: input wait as a fraction of step time (target <= 1% at 32 ranks), the
   per-step input wait and the per-range request latency (p50/p99), the server's CPU use and its
   own step-assembly latency; R raised until the server saturates.
3. Failover: two servers, 16 client ranks, kill -9 of one mid-run (2 s after every rank has its
   first batch): the longest stall any client
   sees (target <= 2 s); every client checks each batch against the in-process reference (global
   indices and a sha256 of its tokens): nothing lost or duplicated.
4. Memory: server RSS with 1 connected client, then 64: growth per client (target <= 5 MB).

Every timed part takes /tmp/gristmill-heavy.lock itself (the wait is not timed) and holds it for
one part (well under 5 minutes); start it without flock::

    .venv/bin/python benchmarks/bench_service.py [--work /tmp/gristmill-bench-service] [--json out.json]
        [--ranks 32 64 128 256] [--parts throughput load failover memory]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # this checkout's packages; the tests' ServeProcess

import pyarrow.flight as flight  # noqa: E402
import torch  # noqa: E402

from gristmill.loader import Batches, Caching, Loader, Sampling, Threads  # noqa: E402
from gristmill.loader.service import client as service_client  # noqa: E402
from gristmill.loader.options import Source  # noqa: E402
from gristmill.manifests.synthetic import build_synthetic, even_shards  # noqa: E402
from bench_vs_datatrove import heavy_lock  # noqa: E402  (the shared lock; the script's folder is on sys.path)
from helpers import ServeProcess  # noqa: E402

SEQ_LEN, SHARD_ROWS, ORDER = 2048, 512, "window"
TICKS = os.sysconf("SC_CLK_TCK")
STEP_S = 0.2


def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


class Server(ServeProcess):
    """``python -m gristmill serve`` on 127.0.0.1 and a free port (the tests' ``ServeProcess``: its output
    drained by a thread), every line written to ``log``."""

    def __init__(self, store: str, cache: str, log: str, *args: str, listen: str = "127.0.0.1:0", env=None):
        super().__init__(store, args=("--cache-dir", cache, *args), log=log, cwd=ROOT, timeout_s=120, listen=listen,
                         env=env)
        if self.url is None:
            raise SystemExit(f"gristmill serve exited: see {log}")

    def stats(self) -> dict:
        c = flight.FlightClient(self.url)
        try:
            return json.loads(next(iter(c.do_action(flight.Action("stats", b"")))).body.to_pybytes())
        finally:
            c.close()

    def stop(self, timeout_s: float = 30.0) -> str:
        return super().stop(timeout_s)


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else float("nan")


def digest(tokens: torch.Tensor) -> str:
    return hashlib.sha256(tokens.contiguous().numpy().tobytes()).hexdigest()[:16]


# -- 1. throughput -----------------------------------------------------------------------------------------------
def throughput(data_url: str, store: str, work: str, steps: int, batch: int) -> dict:
    """Steady state on both sides: each Loader reads ``steps`` steps untimed (its cache warm, every shard
    verified, the server's entry open), then ``steps`` timed, twice, interleaved; the best of each is quoted."""
    sampling = Sampling(global_batch=batch, order=ORDER)
    seqs = steps * batch
    srv = Server(store, os.path.join(work, "cache-serve-1"), os.path.join(work, "serve-throughput.log"))
    inproc = Loader(data_url, sampling, caching=Caching(dir=os.path.join(work, "cache-inproc")),
                    batches=Batches(pin_memory=False))
    served = Loader(data_url, sampling, source=Source(service=(srv.url,)), batches=Batches(pin_memory=False))
    try:
        its = {"inproc": iter(inproc), "served": iter(served)}
        for it in its.values():  # warm: two epochs of the default dataset
            for _ in zip(range(min(steps, 1024)), it):
                pass
        out = {"steps": steps, "global_batch": batch, "sequences": seqs, "rounds": []}
        with heavy_lock("throughput"):
            for _ in range(2):
                rnd = {}
                for name, it in its.items():
                    c0, t0, w0 = cpu_s(srv.pid), os.times(), time.perf_counter()
                    for _ in zip(range(steps), it):
                        pass
                    c1, t1, w1 = cpu_s(srv.pid), os.times(), time.perf_counter()
                    here = (t1.user - t0.user) + (t1.system - t0.system)
                    if name == "inproc":
                        rnd.update(inproc_seq_per_cpu_s=seqs / here, inproc_seq_per_s=seqs / (w1 - w0), inproc_cpu_s=here)
                    else:
                        rnd.update(server_seq_per_cpu_s=seqs / (c1 - c0), service_seq_per_s=seqs / (w1 - w0),
                                   server_cpu_s=c1 - c0, client_seq_per_cpu_s=seqs / here, client_cpu_s=here)
                print("  round: " + ", ".join(f"{k} {v:,.0f}" if v > 100 else f"{k} {v:.2f}" for k, v in rnd.items()),
                      flush=True)
                out["rounds"].append(rnd)
        for k in ("inproc_seq_per_cpu_s", "server_seq_per_cpu_s", "inproc_seq_per_s", "service_seq_per_s",
                  "client_seq_per_cpu_s"):
            out[k] = max(r[k] for r in out["rounds"])
        out["ratio"] = out["server_seq_per_cpu_s"] / out["inproc_seq_per_cpu_s"]
        out["server_stats"] = srv.stats()
        return out
    finally:
        served.close()
        inproc.close()
        srv.stop()


def client_cpu(work: str, seqs: int, seq_lens=(1024, 2048), batches=(8, 32)) -> list[dict]:
    """Target 1 (issue 41): CPU per sequence of the served client (this process: decode, checks, the batch
    tensors) and of client + server, against the in-process Loader's, warm (each Loader reads its steps once
    untimed, then three times timed, interleaved; the best of each; this process's CPU by ``time.process_time``,
    the server's from ``/proc``; the dataset holds up to 32,768 rows, a longer pass wraps into the next epoch,
    as warm), tokens in the stored dtype as the trainer asks
    (``token_dtype=None``: widened on the device). Target: client <= 0.5x, client + server <= 1.5x. Beside them the
    client's floor (``bare``): the same requests to the same server read by pyarrow alone (``do_get`` +
    ``read_all``: gRPC's receive and Arrow's decode, no gristmill code, no batches made)."""
    from gristmill.loader.service.protocol import Request

    out = []
    for seq_len in seq_lens:
        rows = min(max(2 * seqs, 4096), 32768)
        pub = build_synthetic(os.path.join(work, f"cpu-{seq_len}"), dataset="cpu", seq_len=seq_len,
                              shard_rows=even_shards(rows, SHARD_ROWS), val_rows=(), vocab_size=32000, tokens="random")
        srv = Server(os.path.join(work, f"cpu-{seq_len}", "store"), os.path.join(work, f"cache-cpu-serve-{seq_len}"),
                     os.path.join(work, f"serve-cpu-{seq_len}.log"))
        bare = flight.FlightClient(srv.url)
        try:
            for batch in batches:
                steps = seqs // batch
                sampling = Sampling(global_batch=batch, order=ORDER)
                kinds = {"inproc": Loader(pub.url, sampling, caching=Caching(dir=os.path.join(work, f"cache-cpu-{seq_len}")),
                                          batches=Batches(pin_memory=False, token_dtype=None)),
                         "served": Loader(pub.url, sampling, source=Source(service=(srv.url,)),
                                          batches=Batches(pin_memory=False, token_dtype=None))}
                its = {k: iter(ld) for k, ld in kinds.items()}
                n = service_client.range_steps(kinds["served"])
                tickets = [flight.Ticket(Request(manifest_sha256=pub.manifest.sha256, order=ORDER, global_batch=batch,
                                                 start_step=s, steps=min(n, steps - s)).encode())
                           for s in range(0, steps, n)]
                its["bare"] = None
                for name, it in its.items():
                    if it is None:
                        for t in tickets:
                            bare.do_get(t).read_all()
                        continue
                    for _ in zip(range(steps), it):
                        pass
                best: dict[str, float] = {}
                with heavy_lock(f"client cpu seq_len {seq_len} batch {batch}"):
                    for _ in range(3):
                        for name, it in its.items():
                            c0, t0 = cpu_s(srv.pid), time.process_time()
                            if it is None:
                                for t in tickets:
                                    bare.do_get(t).read_all()
                            else:
                                for _ in zip(range(steps), it):
                                    pass
                            c1, t1 = cpu_s(srv.pid), time.process_time()
                            here = (t1 - t0) / seqs * 1e6
                            key = {"inproc": "inproc_us", "served": "client_us", "bare": "bare_us"}[name]
                            best[key] = min(best.get(key, 1e9), here)
                            if name == "served":
                                best["server_us"] = min(best.get("server_us", 1e9), (c1 - c0) / seqs * 1e6)
                for ld in kinds.values():
                    ld.close()
                row = {"seq_len": seq_len, "batch": batch, "sequences": seqs, **{k: round(v, 2) for k, v in best.items()},
                       "client_ratio": round(best["client_us"] / best["inproc_us"], 2),
                       "client_server_ratio": round((best["client_us"] + best["server_us"]) / best["inproc_us"], 2),
                       "bare_ratio": round(best["bare_us"] / best["inproc_us"], 2)}
                print("  client cpu: " + json.dumps(row), flush=True)
                out.append(row)
        finally:
            bare.close()
            srv.stop()
    return out


def server_path(store: str, work: str, batch: int, range_steps: int, steps: int) -> dict:
    """Why the server costs what it does: its request path run in this process without gRPC (the same
    ``_Stream`` the server iterates, over the same warm cache: as built, ``Loader.rows_at_many``) and
    the same by hand (one ``plan_steps`` a request, each step assembled; ``one_plan_per_request``). Sequences per CPU-second, best of 3 each."""
    from concurrent.futures import Future

    from gristmill.loader.loader import plan_steps
    from gristmill.loader.service import server as S
    from gristmill.loader.service.protocol import Request

    srv = S.GristmillServer(S.ServeConfig((store,), port=0, cache_dir=os.path.join(work, "cache-serve-1")))
    sha = next(iter(srv.catalog.by_sha))

    def one_plan(entry, req, stream):
        ld = entry.loader
        starts = np.array([req.first_index(s) for s in range(req.start_step, req.start_step + req.steps)], np.int64)
        for step in plan_steps(ld.order, starts, 0, req.local_batch, ld._entry_of_shard,
                               ld._row_like.shape[1] * ld._row_like.itemsize):
            fetches = []
            for e in ld.cache.pin_ids(step.entries).tolist():
                done = Future()
                done.set_result(ld.cache.ensure(ld._shard_of_entry[e]))
                fetches.append((done, True))
            S.to_record_batch(ld._assemble(step, fetches)[0], stream.schema)
        stream.finish("done")

    def run(n_ranges, batched):
        for k in range(n_ranges):
            req = Request(manifest_sha256=sha, order=ORDER, global_batch=batch, start_step=k * range_steps,
                          steps=range_steps)
            srv.slots.take("bench")
            entry = srv._acquire(req)
            stream = S._Stream(srv, entry, req, "bench")
            if batched:
                one_plan(entry, req, stream)
            else:
                for _ in stream:
                    pass
    out = {"range_steps": range_steps}
    try:
        with heavy_lock("server path without gRPC"):
            for name, batched in (("as_built", False), ("one_plan_per_request", True)):
                run(64, batched)
                best = 0.0
                for _ in range(3):
                    t = time.process_time()
                    run(steps // range_steps, batched)
                    best = max(best, steps * batch / (time.process_time() - t))
                out[f"{name}_seq_per_cpu_s"] = best
    finally:
        srv.shutdown()
    return out


def _floor_server() -> None:
    """``bench_service.py _floor_server``: a minimal Flight server streaming one pre-built record batch of
    ``rows`` x (seq_len + 1) uint16 ``steps`` times per request (no assembly, no checks)."""
    import pyarrow as pa

    class Floor(flight.FlightServerBase):
        def do_get(self, context, ticket):
            rows, steps = json.loads(ticket.ticket)
            tokens = np.random.default_rng(0).integers(1, 32000, (rows, SEQ_LEN + 1), dtype=np.uint16)
            values = pa.Array.from_buffers(pa.uint16(), tokens.size, [None, pa.py_buffer(tokens)])
            rb = pa.RecordBatch.from_arrays([pa.FixedSizeListArray.from_arrays(values, SEQ_LEN + 1),
                                             pa.array(np.arange(rows))], ["tokens", "indices"])
            return flight.GeneratorStream(rb.schema, ((rb, pa.py_buffer(b'{"step": %d}' % i)) for i in range(steps)))
    server = Floor("grpc://127.0.0.1:0")
    print(server.port, flush=True)
    server.serve()


def flight_floor(shapes=((32, 4), (32, 64), (8, 4)), seqs: int = 32768) -> dict:
    """Arrow Flight's own cost here: server CPU a sequence for (rows, steps a request), read to the end."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_floor_server"], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = {}
    try:
        c = flight.FlightClient(f"grpc://127.0.0.1:{int(proc.stdout.readline())}")
        with heavy_lock("flight floor"):
            for rows, steps in shapes:
                best = 0.0
                for _ in range(2):
                    c0 = cpu_s(proc.pid)
                    for _ in range(seqs // (rows * steps)):
                        c.do_get(flight.Ticket(json.dumps([rows, steps]).encode())).read_all()
                    best = max(best, seqs / (cpu_s(proc.pid) - c0))
                out[f"rows_{rows}_steps_{steps}_seq_per_cpu_s"] = best
        c.close()
    finally:
        proc.kill()
        proc.wait()
    return out


# -- client ranks (forked processes) ---------------------------------------------------------------------------
def rank_main(args: dict, rank: int, ready, go, stop, q) -> None:
    """One trainer rank: a served Loader, ``args['steps']`` steps of ``STEP_S`` (or until ``stop``)."""
    try:
        fetch_lat: list[float] = []
        orig = service_client.ServiceBatches.fetch

        def timed_fetch(self, req, k):  # the latency of each range request, failover included
            t, wall = time.perf_counter(), time.time()
            try:
                return orig(self, req, k)
            finally:
                fetch_lat.append((wall, time.perf_counter() - t))
        service_client.ServiceBatches.fetch = timed_fetch
        src = Source(service=tuple(args["urls"]), service_timeout_s=args.get("timeout_s", 60.0))
        sampling = Sampling(global_batch=args["world"] * args["local"], world_size=args["world"], rank=rank,
                            order=ORDER)
        refs = args.get("refs")
        waits, arrivals, bad = [], [], []
        with Loader(args["data_url"], sampling, source=src, batches=Batches(pin_memory=False),
                    threads=Threads(prefetch=args.get("prefetch", 4))) as ld:
            ready.put(rank)
            go.wait()
            t_start, cpu0 = time.perf_counter(), os.times()
            for s, batch in zip(range(args["steps"]), ld):
                if s == 0:
                    ttfb = time.perf_counter() - t_start
                    ready.put(("first", rank))
                waits.append(ld.last_metrics["input_wait_s"])
                arrivals.append(time.time())
                if refs is not None:
                    want_idx, want_hash = refs[s][rank]
                    if batch["indices"].tolist() != want_idx or digest(batch["tokens"]) != want_hash or batch["step"] != s:
                        bad.append(s)
                if stop.is_set() and s >= args.get("min_steps", 0):
                    break
                time.sleep(STEP_S)
            wall, cpu1 = time.perf_counter() - t_start, os.times()
        cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        q.put({"rank": rank, "waits": waits, "arrivals": arrivals, "bad": bad, "fetch_lat": fetch_lat, "wall": wall,
               "steps": len(waits), "ttfb": ttfb, "cpu_s": cpu, "prefetch": args.get("prefetch", 4), "error": None})
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the part
        q.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


class Ranks:
    """Rank processes of one world, forked by multiprocessing's fork server (its imports preloaded, so
    128 start in seconds, and from a process with no gRPC state); ``start()`` releases them together."""

    def __init__(self, args: dict, ranks):
        ctx = mp.get_context("forkserver")  # forked from a process that never opened a gRPC channel
        self.go, self.stop, self.q, self.ready = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=rank_main, args=(args, r, self.ready, self.go, self.stop, self.q), daemon=True)
                      for r in ranks]
        for p in self.procs:
            p.start()

    def start(self, timeout_s: float = 300):
        """Once every rank's Loader is built (or a rank failed: its error comes with the results)."""
        deadline = time.monotonic() + timeout_s
        for _ in self.procs:
            try:
                self.ready.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - queue.Empty: a rank that failed to start reports through q
                break
        self.go.set()

    def all_past_first_batch(self, timeout_s: float = 300) -> None:
        """Until every rank has its first batch (the start's burst is over: steady state)."""
        deadline = time.monotonic() + timeout_s
        got = 0
        while got < len(self.procs) and time.monotonic() < deadline:
            try:
                got += isinstance(self.ready.get(timeout=max(0.1, deadline - time.monotonic())), tuple)
            except Exception:  # noqa: BLE001 - queue.Empty: the deadline
                break

    def results(self, timeout_s: float) -> list[dict]:
        out = []
        deadline = time.monotonic() + timeout_s
        while len(out) < len(self.procs) and time.monotonic() < deadline:
            try:
                out.append(self.q.get(timeout=max(0.1, deadline - time.monotonic())))
            except Exception:  # noqa: BLE001 - queue.Empty: the deadline
                break
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        if len(out) < len(self.procs):
            raise SystemExit(f"{len(self.procs) - len(out)} rank processes gave no result in {timeout_s} s")
        errors = [r["error"] for r in out if r["error"]]
        if errors:
            raise SystemExit(f"{len(errors)} ranks failed, first: {errors[0]}")
        return sorted(out, key=lambda r: r["rank"])


def wait_summary(results: list[dict]) -> dict:
    """Input wait after each rank's first batch: per rank as a fraction of its step time (the simulated
    200 ms plus the wait); per step p50/p99. ``steady``: after the first two ranges (the start's burst of
    every rank asking at once is over)."""
    fracs, steady, waits, fetch = [], [], [], []
    for r in results:
        w = r["waits"][1:]
        waits += w
        fetch += [d for _, d in r["fetch_lat"]]
        fracs.append(sum(w) / (sum(w) + STEP_S * len(w)))
        ws = r["waits"][2 * r["prefetch"]:]
        steady.append(sum(ws) / (sum(ws) + STEP_S * len(ws)) if ws else 0.0)
    return {"wait_fraction_mean": float(np.mean(fracs)), "wait_fraction_max": float(np.max(fracs)),
            "steady_wait_fraction_mean": float(np.mean(steady)), "steady_wait_fraction_max": float(np.max(steady)),
            "first_batch_p50_s": pct([r["ttfb"] for r in results], 50),
            "first_batch_max_s": max(r["ttfb"] for r in results),
            "step_wall_mean_s": float(np.mean([r["wall"] / r["steps"] for r in results])),
            "client_cpu_per_step_ms": float(np.mean([r["cpu_s"] / r["steps"] for r in results])) * 1e3,
            "wait_p50_ms": pct(waits, 50) * 1e3, "wait_p99_ms": pct(waits, 99) * 1e3,
            "wait_max_ms": max(waits) * 1e3, "range_latency_p50_ms": pct(fetch, 50) * 1e3,
            "range_latency_p99_ms": pct(fetch, 99) * 1e3}


# -- 2. load ---------------------------------------------------------------------------------------------------
def load(data_url: str, store: str, work: str, ranks_list: list[int], steps: int, local: int) -> list[dict]:
    srv = Server(store, os.path.join(work, "cache-serve-load"), os.path.join(work, "serve-load.log"))
    out = []
    try:
        warm = Ranks({"urls": [srv.url], "data_url": data_url, "world": 1, "local": 256, "steps": 64}, [0])
        warm.start()
        warm.results(300)  # the server's cache filled (all shards) before any timed run
        for n in ranks_list:
            args = {"urls": [srv.url], "data_url": data_url, "world": n, "local": local, "steps": steps}
            with heavy_lock(f"load {n} ranks"):
                ranks = Ranks(args, range(n))
                ranks.start()  # once every rank's Loader is built
                s0, c0, w0 = srv.stats(), cpu_s(srv.pid), time.perf_counter()
                results = ranks.results(steps * STEP_S * 20 + 120)
                c1, w1, s1 = cpu_s(srv.pid), time.perf_counter(), srv.stats()
                load1 = os.getloadavg()[0]
            row = {"ranks": n, "loadavg_1m_after": load1, "global_batch": n * local, "steps": steps, **wait_summary(results),
                   "server_cpu_util": (c1 - c0) / (w1 - w0), "server_cpu_s": c1 - c0, "wall_s": w1 - w0,
                   "server_step_p50_ms": s1["step_latency_p50_s"] * 1e3, "server_step_p99_ms": s1["step_latency_p99_s"] * 1e3,
                   "server_rss_mb": rss_mb(srv.pid), "refused": s1.get("refused", 0) - s0.get("refused", 0),
                   "retries": 0, "steps_served": s1.get("steps", 0) - s0.get("steps", 0)}
            out.append(row)
            print("  " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                  flush=True)
            if row["wait_fraction_mean"] > 0.05 and row["server_cpu_util"] > 0.85:
                break  # saturated: no point in doubling again
    finally:
        srv.stop()
    return out


# -- 3. failover -----------------------------------------------------------------------------------------------
def reference(data_url: str, cache: str, world: int, local: int, steps: int) -> list[list[tuple[list[int], str]]]:
    """(indices, tokens digest) of every rank at every step, from one in-process Loader of the global batch."""
    refs = []
    with Loader(data_url, Sampling(global_batch=world * local, order=ORDER), caching=Caching(dir=cache),
                batches=Batches(pin_memory=False)) as ld:
        for _, b in zip(range(steps), ld):
            refs.append([(b["indices"][r * local:(r + 1) * local].tolist(), digest(b["tokens"][r * local:(r + 1) * local]))
                         for r in range(world)])
    return refs


def failover(data_url: str, store: str, work: str, world: int, local: int, steps: int, kill_after_s: float) -> dict:
    cache = os.path.join(work, "cache-serve-failover")  # one node-local cache shared by both servers
    refs = reference(data_url, os.path.join(work, "cache-inproc"), world, local, steps)
    a = Server(store, cache, os.path.join(work, "serve-failover-a.log"))
    b = Server(store, cache, os.path.join(work, "serve-failover-b.log"))
    try:
        warm = Ranks({"urls": [a.url, b.url], "data_url": data_url, "world": 1, "local": 256, "steps": 64}, [0])
        warm.start()
        warm.results(300)
        args = {"urls": [a.url, b.url], "data_url": data_url, "world": world, "local": local, "steps": steps,
                "refs": refs}
        with heavy_lock(f"failover {world} ranks"):
            ranks = Ranks(args, range(world))
            ranks.start()
            ranks.all_past_first_batch()  # kill in the steady state, not in the start's burst
            time.sleep(kill_after_s)
            killed_at = time.time()
            os.kill(a.pid, signal.SIGKILL)
            results = ranks.results(steps * STEP_S * 20 + 120)
    finally:
        a.kill()
        b.stop()
    stalls, recovery = [], []
    for r in results:
        recovery += [d for t, d in r["fetch_lat"] if t + d >= killed_at]  # ranges in flight at the kill, or after
        after = [w for w, t in zip(r["waits"][1:], r["arrivals"][1:]) if t >= killed_at]
        stalls.append(max(after) if after else 0.0)
    return {"ranks": world, "steps": steps, "kill_after_s": kill_after_s, **wait_summary(results),
            "longest_stall_s": max(stalls), "longest_stall_p50_s": pct(stalls, 50),
            "range_latency_after_kill_max_s": max(recovery), "range_latency_after_kill_p50_s": pct(recovery, 50),
            "steps_checked": sum(r["steps"] for r in results), "steps_wrong": sum(len(r["bad"]) for r in results),
            "ranks_complete": sum(r["steps"] == steps for r in results)}


def outage(data_url: str, store: str, work: str, world: int, local: int, steps: int, outage_s: float) -> dict:
    """Target 3 (issue 41): both servers killed -9 in the steady state, one started again on its port
    ``outage_s`` later: no rank fails, every batch is the in-process one, and the longest stall any rank sees
    is at most ``outage_s + 2`` s (the client's backoff is capped at 1 s; gRPC's reconnect backoff at 1 s)."""
    cache = os.path.join(work, "cache-serve-failover")
    refs = reference(data_url, os.path.join(work, "cache-inproc"), world, local, steps)
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    servers = [Server(store, cache, os.path.join(work, f"serve-outage-{i}.log"), listen=f"127.0.0.1:{p}")
               for i, p in enumerate(ports)]
    try:
        args = {"urls": [s.url for s in servers], "data_url": data_url, "world": world, "local": local, "steps": steps,
                "refs": refs}
        with heavy_lock(f"outage {world} ranks, {outage_s:g} s"):
            ranks = Ranks(args, range(world))
            ranks.start()
            ranks.all_past_first_batch()
            time.sleep(2.0)
            killed_at = time.time()
            for srv in servers:
                os.kill(srv.pid, signal.SIGKILL)
            time.sleep(outage_s)
            servers[0] = Server(store, cache, os.path.join(work, "serve-outage-0b.log"), listen=f"127.0.0.1:{ports[0]}")
            back_at = time.time()
            results = ranks.results(steps * STEP_S * 20 + 300)
    finally:
        for srv in servers:
            srv.kill()
    stalls = []
    for r in results:
        after = [w for w, t in zip(r["waits"][1:], r["arrivals"][1:]) if t >= killed_at]
        stalls.append(max(after) if after else 0.0)
    return {"ranks": world, "steps": steps, "outage_s": outage_s, "restart_s": round(back_at - killed_at, 2),
            "longest_stall_s": round(max(stalls), 2), "longest_stall_p50_s": round(pct(stalls, 50), 2),
            "steps_checked": sum(r["steps"] for r in results), "steps_wrong": sum(len(r["bad"]) for r in results),
            "ranks_complete": sum(r["steps"] == steps for r in results)}


def unauthenticated(store: str, work: str) -> dict:
    """Target 4 (issue 41): server RSS (sampled every 5 ms) while unauthenticated requests of 1 GiB, then 8 x 128
    MiB at once, are sent raw over gRPC to a server that requires a token; each must be refused by gRPC."""
    import grpc
    import threading

    srv = Server(store, os.path.join(work, "cache-serve-unauth"), os.path.join(work, "serve-unauth.log"),
                 env={"GRISTMILL_SERVE_TOKEN": "a-token-the-requests-do-not-carry"})
    out = {"rss_start_mb": rss_mb(srv.pid)}
    try:
        with heavy_lock("unauthenticated requests"):
            for size, count in ((1 << 30, 1), (128 << 20, 8)):
                channel = grpc.insecure_channel(srv.url.split("://")[1], options=[("grpc.max_send_message_length", -1)])
                call = channel.unary_stream("/arrow.flight.protocol.FlightService/DoGet")
                payload, codes, peak, stop = bytes(size), [], [0.0], threading.Event()
                base = rss_mb(srv.pid)

                def sample():
                    while not stop.is_set():
                        peak[0] = max(peak[0], rss_mb(srv.pid))
                        time.sleep(0.005)

                def send():
                    try:
                        list(call(payload, timeout=120))
                        codes.append("served")
                    except grpc.RpcError as e:
                        codes.append(e.code().name)

                watcher = threading.Thread(target=sample)
                watcher.start()
                senders = [threading.Thread(target=send) for _ in range(count)]
                for t in senders:
                    t.start()
                for t in senders:
                    t.join()
                stop.set()
                watcher.join()
                channel.close()
                del payload
                out[f"{count}x{size >> 20}MiB"] = {"rss_before_mb": round(base, 1), "rss_peak_rise_mb": round(peak[0] - base, 1),
                                                   "codes": sorted(set(codes))}
    finally:
        srv.stop()
    return out


# installed here, absent from the serve image (deploy/Dockerfile.serve: the serve extra's packages only); numba
# imports scipy when it is there
NOT_IN_SERVE_IMAGE = ("torch", "scipy")


def start_rss(store: str, work: str) -> dict:
    """Target 5 (issue 41): server RSS once it listens, and whether it imported torch (/proc/<pid>/maps); in this
    environment, and as on the serve image: NOT_IN_SERVE_IMAGE's packages made unimportable (a stub package of
    each that raises ImportError, first on PYTHONPATH)."""
    stubs = os.path.join(work, "not-in-serve-image")
    for name in NOT_IN_SERVE_IMAGE:
        os.makedirs(os.path.join(stubs, name), exist_ok=True)
        with open(os.path.join(stubs, name, "__init__.py"), "w") as f:
            f.write(f"raise ImportError('{name} is not in the serve image')\n")
    out = {}
    for case, env in (("here", None), ("serve_image", {"PYTHONPATH": stubs})):
        srv = Server(store, os.path.join(work, "cache-serve-start"), os.path.join(work, f"serve-start-{case}.log"), env=env)
        try:
            time.sleep(1.0)
            with open(f"/proc/{srv.pid}/maps") as f:
                torch_loaded = "libtorch" in f.read()
            out[case] = {"rss_at_start_mb": round(rss_mb(srv.pid), 1), "torch_loaded": torch_loaded}
        finally:
            srv.stop()
    return out


# -- 4. memory -------------------------------------------------------------------------------------------------
def memory(data_url: str, store: str, work: str, clients: int, local: int) -> dict:
    srv = Server(store, os.path.join(work, "cache-serve-load"), os.path.join(work, "serve-memory.log"))
    try:
        base = {"urls": [srv.url], "data_url": data_url, "world": clients, "local": local, "steps": 1500,
                "min_steps": 10}
        with heavy_lock(f"memory 1 -> {clients} clients"):
            rss0 = rss_mb(srv.pid)
            first = Ranks(base, [0])
            first.start()
            time.sleep(5)  # ~25 steps: the server's Loader entry open, the client's connection steady
            rss1 = rss_mb(srv.pid)
            rest = Ranks(base, range(1, clients))
            rest.start()
            samples = []
            for _ in range(40):  # 8 s: every client past 10 steps
                time.sleep(0.2)
                samples.append(rss_mb(srv.pid))
            rss_n = rss_mb(srv.pid)
            active = srv.stats()
            first.stop.set()
            rest.stop.set()
            first.results(120)
            rest.results(300)
        return {"clients": clients, "rss_start_mb": rss0, "rss_1_client_mb": rss1, f"rss_{clients}_clients_mb": rss_n,
                "rss_peak_mb": max(samples), "per_client_mb": (rss_n - rss1) / (clients - 1),
                "per_client_peak_mb": (max(samples) - rss1) / (clients - 1), "server_clients_seen": active["clients"]}
    finally:
        srv.stop()


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {"cpu": cpu, "cpus": os.cpu_count(), "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
            "python": platform.python_version(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/gristmill-bench-service")
    ap.add_argument("--sequences", type=int, default=16384, help="rows of the synthetic dataset (seq_len 2048)")
    ap.add_argument("--parts", nargs="+", default=["throughput", "load", "failover", "memory"])
    ap.add_argument("--throughput-steps", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=32, help="throughput: global batch")
    ap.add_argument("--ranks", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--local-batch", type=int, default=8, help="load, failover, memory: sequences per rank per step")
    # load and failover run past the first two ranges of 64 steps (Source.service_steps_per_request), so
    # every rank keeps asking (and the failover's ranks ask the killed server again)
    ap.add_argument("--load-steps", type=int, default=160)
    ap.add_argument("--failover-steps", type=int, default=160)
    ap.add_argument("--memory-clients", type=int, default=64)
    ap.add_argument("--outage-s", type=float, default=10.0, help="outage: seconds with every server down")
    ap.add_argument("--outage-ranks", type=int, default=16)
    ap.add_argument("--cpu-sequences", type=int, default=8192, help="client_cpu: sequences timed per case")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: the servers stopped
    mp.set_forkserver_preload(["torch", "pyarrow.flight", "gristmill.loader", "gristmill.loader.service.client"])
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t = time.perf_counter()
    pub = build_synthetic(os.path.join(a.work, "data"), dataset="bench", seq_len=SEQ_LEN,
                          shard_rows=even_shards(a.sequences, SHARD_ROWS), val_rows=(), vocab_size=32000,
                          tokens="random")
    store = os.path.join(a.work, "data", "store")
    out = {"machine": machine(), "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
           "dataset": {"sequences": a.sequences, "seq_len": SEQ_LEN, "shard_rows": SHARD_ROWS, "order": ORDER,
                       "build_s": round(time.perf_counter() - t, 1)}}
    print(f"dataset: {a.sequences} x {SEQ_LEN} in {out['dataset']['build_s']} s", flush=True)
    if "client_cpu" in a.parts:
        out["client_cpu"] = client_cpu(a.work, a.cpu_sequences)
    if "throughput" in a.parts:
        out["throughput"] = throughput(pub.url, store, a.work, a.throughput_steps, a.batch)
        print(f"throughput: server {out['throughput']['server_seq_per_cpu_s']:,.0f} seq/CPU-s, in-process "
              f"{out['throughput']['inproc_seq_per_cpu_s']:,.0f}: ratio {out['throughput']['ratio']:.2f}", flush=True)
        out["server_path"] = server_path(store, a.work, a.batch, Source().service_steps_per_request,
                                         a.throughput_steps // 2)
        print("server path without gRPC: " + json.dumps(out["server_path"]), flush=True)
        out["flight_floor"] = flight_floor()
        print("Flight alone: " + json.dumps(out["flight_floor"]), flush=True)
    if "outage" in a.parts:
        out["outage"] = outage(pub.url, store, a.work, a.outage_ranks, a.local_batch, a.failover_steps, a.outage_s)
        print("outage: " + json.dumps(out["outage"]), flush=True)
    if "unauthenticated" in a.parts:
        out["unauthenticated"] = unauthenticated(store, a.work)
        print("unauthenticated: " + json.dumps(out["unauthenticated"]), flush=True)
    if "start_rss" in a.parts:
        out["start_rss"] = start_rss(store, a.work)
        print("start_rss: " + json.dumps(out["start_rss"]), flush=True)
    if "failover" in a.parts:
        out["failover"] = failover(pub.url, store, a.work, 16, a.local_batch, a.failover_steps, kill_after_s=2.0)
        print("failover: " + json.dumps(out["failover"]), flush=True)
    if "memory" in a.parts:
        out["memory"] = memory(pub.url, store, a.work, a.memory_clients, a.local_batch)
        print("memory: " + json.dumps(out["memory"]), flush=True)
    if "load" in a.parts:
        out["load"] = load(pub.url, store, a.work, a.ranks, a.load_steps, a.local_batch)
    text = json.dumps(out, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_floor_server"]:
        _floor_server()
    else:
        sys.exit(main())
