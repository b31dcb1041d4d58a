"""Where the served client's CPU goes, beside the in-process Loader's (issue 41 target 1): CPU of
this process over a warm pass of each, split into the consumer's thread, the Loader's or the service client's
Python pool threads (each thread's CPU clock) and the rest (gRPC's and Arrow's C++ threads); then a cProfile of
each consumer thread (the Loader's iteration), and of the client's range path (``ServiceBatches.fetch``:
``do_get``, reading the reply, checks, the batches) run in one thread. Microseconds of CPU per sequence. Start it under the shared lock::

    flock /tmp/gm-heavy.lock .venv/bin/python benchmarks/profile_service_client.py [--seq-len 1024] [--batch 8 32]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from gristmill.loader import Batches, Caching, Loader, Sampling  # noqa: E402
from gristmill.loader.options import Source  # noqa: E402
from gristmill.manifests.synthetic import build_synthetic, even_shards  # noqa: E402
from helpers import ServeProcess  # noqa: E402

def thread_cpu() -> dict:
    """CPU seconds of this process (``"total"``) and of each live Python thread (by name kind), ns clocks."""
    out = {"total": time.process_time()}
    for t in threading.enumerate():
        try:
            cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError):  # ended meanwhile
            continue
        out[t.ident] = (kind(t), cpu)
    return out


def kind(t: threading.Thread) -> str:
    if t is threading.main_thread():
        return "main (consumer)"
    return t.name.rsplit("_", 1)[0].rsplit("-", 1)[0] if t.name.startswith("gristmill") else "other Python"


def split(before: dict, after: dict, seqs: int) -> dict[str, float]:
    """us/sequence of the main thread, this process's Python threads by kind and the rest (C++ threads: gRPC's
    and Arrow's, which Python cannot name), from two ``thread_cpu`` samples."""
    out: dict[str, float] = {}
    for ident, value in after.items():
        if ident == "total":
            continue
        name, cpu = value
        out[name] = out.get(name, 0.0) + (cpu - before.get(ident, (name, 0.0))[1]) / seqs * 1e6
    total = (after["total"] - before["total"]) / seqs * 1e6
    out["C++ threads (gRPC, Arrow)"] = total - sum(out.values())
    out["total"] = total
    return {k: round(v, 2) for k, v in out.items()}


def top(prof: cProfile.Profile, n: int) -> str:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(n)
    return s.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/gristmill-profile-client")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--sequences", type=int, default=65536)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    pub = build_synthetic(os.path.join(a.work, "data"), dataset="prof", seq_len=a.seq_len,
                          shard_rows=even_shards(min(max(2 * a.sequences, 4096), 32768), 512), val_rows=(), vocab_size=32000,
                          tokens="random")
    srv = ServeProcess(os.path.join(a.work, "data", "store"), args=("--cache-dir", os.path.join(a.work, "cache-serve")))
    try:
        for batch in a.batch:
            steps = a.sequences // batch
            sampling = Sampling(global_batch=batch, order="window")
            kinds = {"inproc": Loader(pub.url, sampling, caching=Caching(dir=os.path.join(a.work, "cache")),
                                      batches=Batches(pin_memory=False, token_dtype=None)),
                     "served": Loader(pub.url, sampling, source=Source(service=(srv.url,)),
                                      batches=Batches(pin_memory=False, token_dtype=None))}
            its = {k: iter(ld) for k, ld in kinds.items()}
            for it in its.values():  # warm
                for _ in zip(range(steps), it):
                    pass
            for name, it in its.items():
                best = None
                for _ in range(2):
                    t0 = thread_cpu()
                    for _ in zip(range(steps), it):
                        pass
                    got = split(t0, thread_cpu(), a.sequences)
                    best = got if best is None or got["total"] < best["total"] else best
                print(f"batch {batch} {name}: us/sequence by thread {best}", flush=True)
                prof = cProfile.Profile()
                prof.enable()
                for _ in zip(range(steps), it):
                    pass
                prof.disable()
                print(f"batch {batch} {name}: the consumer thread under cProfile", flush=True)
                print(top(prof, a.top), flush=True)
            remote = kinds["served"].remote  # the range path alone, in this thread, under cProfile
            n = remote.range_steps
            reqs = [remote.request(s, n) for s in range(0, steps - n + 1, n)]
            for req in reqs:
                remote.fetch(req, 0)
            prof = cProfile.Profile()
            t0 = thread_cpu()
            prof.enable()
            for req in reqs:
                remote.fetch(req, 0)
            prof.disable()
            print(f"batch {batch} served fetch() alone ({len(reqs)} ranges of {n} steps): "
                  f"{split(t0, thread_cpu(), len(reqs) * n * batch)}", flush=True)
            print(top(prof, a.top), flush=True)
            for ld in kinds.values():
                ld.close()
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
