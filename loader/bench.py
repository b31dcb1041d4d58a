"""``gristmill loader bench``: how long a trainer waits for its input.

A simulated trainer (a fixed compute time per step, spent sleeping the way a GPU step leaves
the CPU free) consumes a manifest through a simulated remote store (``gmsim://``: latency per
request, bandwidth) twice: first with an empty cache (cold), then again with the cache the
first pass filled (warm). Per pass it reports the input wait per step (p50, p95, max after the
first batch, and as a fraction of step time), time to first batch, tokens/s, bytes fetched.

With ``ranks`` > 1 each pass runs as that many processes, rank r of ``ranks`` of one simulated
job, sharing one cache directory as the ranks of a node do, all started together: every rank
reports its own wait (``PassResult.rank``), so a rank starved by the others shows.

With ``service`` (:func:`served_passes`) the same trainer reads its batches from ``gristmill
serve`` endpoints instead (``Source.service``): two passes over the same steps, ``first`` and
``again`` (the second finds the servers' caches as the first left them); bytes served and the
client's retries replace bytes fetched and cache hits.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import queue
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from gristmill.manifests.storage import local_path, register_simulated_store, simulated_url

from .loader import Loader
from .options import sections


@dataclass
class PassResult:
    name: str
    steps: int
    time_to_first_batch_s: float
    wait_p50_ms: float
    wait_p95_ms: float
    wait_max_ms: float
    wait_fraction: float  # input wait / step time, after the first batch
    tokens_per_s: float
    samples_per_s: float
    bytes_fetched: int
    cache_hits: int
    cache_misses: int
    bytes_served: int = 0  # through `gristmill serve` (Source.service)
    service_retries: int = 0
    rank: int = 0  # of ``ranks`` processes (cold_and_warm)


def run_pass(name: str, url: str, *, steps: int, step_s: float, storage_options: dict | None = None,
             **loader_kw) -> PassResult:
    """One simulated training run of ``steps`` steps; ``loader_kw`` go to :class:`Loader`."""
    t_start = time.perf_counter()
    waits, step_times = [], []
    fetched = hits = misses = served = retries = 0
    ttfb = float("nan")  # stays so if the dataset ends before the first batch
    with Loader(url, **sections(storage_options=storage_options or {}, **loader_kw)) as ld:
        it = iter(ld)
        for s in range(steps):
            t0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            if s == 0:
                ttfb = time.perf_counter() - t_start
            m = ld.last_metrics
            served, retries = m.get("service_bytes", served), m.get("service_retries", retries)  # cumulative
            waits.append(m["input_wait_s"])
            fetched, hits, misses = fetched + m["bytes_downloaded"], hits + m["cache_hits"], misses + m["cache_misses"]
            time.sleep(step_s)  # the trainer's compute: the CPU is free for the loader's threads
            step_times.append(time.perf_counter() - t0)
        wall = time.perf_counter() - t_start
        samples = len(waits) * ld.global_batch
        tokens = samples * ld.manifest.seq_len
    after = np.array(waits[1:] or [0.0])
    return PassResult(
        name=name, rank=loader_kw.get("rank", 0), steps=len(waits), time_to_first_batch_s=round(ttfb, 4),
        wait_p50_ms=round(float(np.percentile(after, 50)) * 1e3, 3), wait_p95_ms=round(float(np.percentile(after, 95)) * 1e3, 3),
        wait_max_ms=round(float(after.max()) * 1e3, 3),
        wait_fraction=round(float(after.sum() / max(sum(step_times[1:]), 1e-12)), 5),
        tokens_per_s=round(tokens / wall, 1), samples_per_s=round(samples / wall, 1),
        bytes_fetched=fetched, cache_hits=hits, cache_misses=misses, bytes_served=served, service_retries=retries,
    )


def cold_and_warm(url: str, *, steps: int, step_s: float, latency_s: float, bandwidth_bps: float | None,
                  cache_dir: str | None = None, ranks: int = 1, **loader_kw) -> list[PassResult]:
    """The cold pass (empty cache) then the warm pass (the cache it left), through the simulated
    store; with ``ranks`` > 1 each pass is that many processes at once (one result per rank)."""
    opts = None
    if (local := local_path(url)) is not None:  # a local dataset: serve it as a slow remote
        register_simulated_store()
        url = simulated_url(local)
        opts = {"latency_s": latency_s, "bandwidth_bps": bandwidth_bps}
    # A fresh directory (under ``cache_dir`` when given, e.g. on the NVMe to measure) so the
    # first pass is truly cold; never an existing cache, which this would have to empty.
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
    cache_dir = tempfile.mkdtemp(prefix="gristmill-bench-cache-", dir=cache_dir)
    try:
        if ranks == 1:
            return [run_pass(name, url, steps=steps, step_s=step_s, storage_options=opts, cache_dir=cache_dir,
                             **loader_kw) for name in ("cold", "warm")]
        return [r for name in ("cold", "warm") for r in _ranks_at_once(
            ranks, dict(name=name, url=url, steps=steps, step_s=step_s, storage_options=opts, cache_dir=cache_dir,
                        world_size=ranks, **loader_kw))]
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _ranks_at_once(ranks: int, kw: dict) -> list[PassResult]:
    """One pass as ``ranks`` processes (spawned, not forked: a fork would copy this process's
    loader threads' locks), released together by a barrier; their results in rank order."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(ranks), ctx.Queue()
    procs = [ctx.Process(target=_rank_pass, args=(barrier, results, {**kw, "rank": r}), daemon=True)
             for r in range(ranks)]
    for p in procs:
        p.start()
    out: list = []
    try:
        while len(out) < ranks:
            try:
                out.append(results.get(timeout=1.0))
            except queue.Empty:  # a rank killed outright never answers: say so instead of waiting
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"loader bench: rank {dead[0]} exited with code {procs[dead[0]].exitcode}") from None
    finally:
        for p in procs:
            p.join(timeout=10)
    failed = [o for o in out if isinstance(o, str)]
    if failed:
        raise RuntimeError(f"loader bench rank failed: {failed[0]}")
    return sorted(out, key=lambda r: r.rank)


def _rank_pass(barrier, results, kw: dict) -> None:
    register_simulated_store()  # the simulated store, in this process too
    barrier.wait()
    try:
        results.put(run_pass(kw.pop("name"), kw.pop("url"), **kw))
    except Exception as e:  # the parent names it; a traceback from a child would be lost
        results.put(f"rank {kw.get('rank')}: {type(e).__name__}: {e}")


def served_passes(url: str, service: tuple[str, ...], *, steps: int, step_s: float, **loader_kw) -> list[PassResult]:
    """Two passes of the same steps through ``gristmill serve`` at ``service`` (``first``, then ``again``):
    ``url`` is the dataset as the trainer names it (a URL, or a name or sha256 the service resolves)."""
    return [run_pass(name, url, steps=steps, step_s=step_s, service=service, **loader_kw)
            for name in ("first", "again")]


COLUMNS = [("pass", "name", "{}"), ("rank", "rank", "{}"), ("steps", "steps", "{}"), ("first batch s", "time_to_first_batch_s", "{:.3f}"),
           ("wait p50 ms", "wait_p50_ms", "{:.2f}"), ("wait p95 ms", "wait_p95_ms", "{:.2f}"),
           ("wait max ms", "wait_max_ms", "{:.2f}"), ("wait/step", "wait_fraction", "{:.2%}"),
           ("tokens/s", "tokens_per_s", "{:,.0f}"), ("MB fetched", "bytes_fetched", "{}"),
           ("hits", "cache_hits", "{}"), ("misses", "cache_misses", "{}")]


SERVED_COLUMNS = COLUMNS[:-3] + [("MB served", "bytes_served", "{}"), ("retries", "service_retries", "{}")]


def table(results: list[PassResult]) -> str:
    def cell(r, key, fmt):
        v = getattr(r, key)
        return f"{v / 1e6:,.1f}" if key.startswith("bytes_") else fmt.format(v)
    columns = SERVED_COLUMNS if any(r.bytes_served for r in results) else COLUMNS
    if not any(r.rank for r in results):  # one process: no rank column
        columns = [c for c in columns if c[1] != "rank"]
    rows = [[h for h, _, _ in columns]] + [[cell(r, k, f) for _, k, f in columns] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def to_json(results: list[PassResult], config: dict) -> str:
    return json.dumps({"config": config, "passes": [asdict(r) for r in results]}, indent=1, sort_keys=True)
