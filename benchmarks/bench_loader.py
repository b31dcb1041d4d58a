"""The loader's targets, measured side by side in one run (see docs/benchmarks.md).

1. Warm cache, global shuffle, seq_len 2048, batches of 32 (and 256): samples/s of the Loader
   in both output modes (``token_dtype=None``: the shards' uint16, what the trainer asks for;
   ``token_dtype=torch.int64``: the default) against
   - the ceiling: a raw numpy memmap gather of the same rows in the same order (uint16, no
     conversion, order precomputed outside the timer);
   - that gather plus widening to the same int64 output (one contiguous (B, 2049) tensor);
   - LitData ``StreamingDataset(shuffle=True)`` over the same tokens (``TokensLoader``,
     block 2049), both bare item iteration and iteration plus the same batch formation.
   Methods run interleaved, ``--repeats`` times; each one's best run is quoted, since the
   machine is shared and noisy. Every loader and the memmap are opened once and read on from
   run to run (repeat r reads the same steps in every method), so each method's best run is
   in the steady state of a long run: its pages already mapped, as in the ceiling's.
2. Cold cache behind a simulated store (``gmsim://``) with 50 ms per request and 1 GB/s,
   100 ms per step: the input wait after the first batch as a fraction of step time (window
   and global order), on small shards so a pass crosses several windows.
3. Peak RSS of a fresh process running the loader (global order, cold cache) over 1x and 10x
   the shards, for the same number of steps (just under one epoch of the 1x dataset), with the
   default ``mapped_limit_bytes`` (256 MiB of shard pages kept mapped) and with a limit both
   datasets exceed (``--rss-limit-mb``), which the warm section also prices.
4. Mixtures: the same warm-cache global-shuffle read (batch 32, uint16, workers=0) of one dataset
   of ``--mix-sequences`` rows against a mixture (``gristmill mix``, weights 5:3:2) of three
   datasets holding the same number of rows in the same shard size, interleaved runs, best of
   ``--repeats``: what the interleave and the per-component orders cost.

    python benchmarks/bench_loader.py [--sequences 50000] [--work /tmp/gristmill-bench-loader] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]  # this checkout's packages

from gristmill.loader import Batches, Caching, Loader, Sampling, Threads  # noqa: E402
from gristmill.loader.bench import cold_and_warm, table  # noqa: E402
from gristmill.manifests import load_manifest  # noqa: E402
from gristmill.manifests.synthetic import build_synthetic, even_shards  # noqa: E402

SEQ_LEN, BATCH = 2048, 32


class Timer:
    """Wall time and this process's CPU time (all threads): on a shared machine the wall rate
    swings with the neighbours' load, samples per CPU-second much less."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def rates(self, samples: int) -> tuple[float, float]:
        return samples / (time.perf_counter() - self.wall), samples / max(time.process_time() - self.cpu, 1e-9)


def dataset(work: str, name: str, sequences: int, shard_rows: int):
    """Build once per work dir; later runs reuse it."""
    root = os.path.join(work, name)
    url = os.path.join(root, "store", "synthetic")
    if os.path.exists(os.path.join(url, "latest")):
        return load_manifest(url)
    t = time.perf_counter()
    pub = build_synthetic(root, seq_len=SEQ_LEN, shard_rows=even_shards(sequences, shard_rows), val_rows=(),
                          vocab_size=32000, tokens="random")
    print(f"built {name}: {sequences:,} sequences in {len(pub.manifest.shards)} shards ({time.perf_counter() - t:.1f}s)")
    return pub


def warm_cache(pub, cache_dir: str) -> None:
    rows = pub.manifest.shards[0].rows
    with Loader(pub, Sampling(order="sequential", global_batch=rows, epochs=1), caching=Caching(dir=cache_dir),
                threads=Threads(prefetch=1)) as ld:
        for _ in ld:
            pass


# -- 1. warm throughput --------------------------------------------------------------------
class LoaderRun:
    """One loader, opened once and read on from run to run (warm-up: the once-per-process
    re-hash of every cached shard and the numba kernel's load)."""

    def __init__(self, pub, cache_dir: str, batch: int, warmup: int, workers: int, token_dtype, mapped_limit=None):
        # mapped_limit None: no limit. Alone, a loader over this 205 MB dataset stays under the default
        # 256 MiB and never releases; but the limit is per process and five loaders live in this one.
        self.ld = Loader(pub, Sampling(order="global", seed=0, global_batch=batch),
                         caching=Caching(dir=cache_dir, mapped_limit_bytes=mapped_limit),
                         threads=Threads(workers=workers, prefetch=8), batches=Batches(token_dtype=token_dtype))
        self.it, self.batch = iter(self.ld), batch
        for _ in range(warmup):
            next(self.it)

    def rate(self, steps: int) -> tuple[float, float]:
        t = Timer()
        for _ in range(steps):
            next(self.it)
        return t.rates(steps * self.batch)


def flat_memmap(pub, cache_dir: str, work: str) -> np.ndarray:
    """All rows of the split in one (N, seq_len + 1) uint16 file: the simplest possible reader."""
    from gristmill.manifests import MappedShard

    m = pub.manifest
    path = os.path.join(work, f"flat-{m.sha256[:12]}.u16")
    n = sum(s.rows for s in m.shards_of("train"))
    if not os.path.exists(path):
        mm = np.memmap(path + ".tmp", dtype=np.uint16, mode="w+", shape=(n, SEQ_LEN + 1))
        at = 0
        for s in m.shards_of("train"):
            shard = MappedShard(os.path.join(cache_dir, f"{s.raw_sha256}.arrow"))
            mm[at:at + s.rows] = shard.rows
            at += s.rows
            shard.close()
        mm.flush()
        del mm
        os.replace(path + ".tmp", path)
    return np.memmap(path, dtype=np.uint16, mode="r", shape=(n, SEQ_LEN + 1))


def flat_rows(pub, batch: int, steps: int) -> np.ndarray:
    """The rows of the loader's first ``steps`` steps as row numbers of the flat file, (steps, batch)."""
    from gristmill.loader.order import Order

    o = Order(pub.manifest, "train", 0, "global")
    shards, rows = o.locate(np.arange(steps * batch))
    return (o.offsets[np.searchsorted(o.shard_ids, shards)] + rows).reshape(-1, batch)


def memmap_rate(mm: np.ndarray, flat: np.ndarray, to_int64: bool = False) -> tuple[float, float]:
    import torch

    batch = flat.shape[1]
    t = Timer()
    if to_int64:  # the loader's int64 output: one contiguous (B, seq_len + 1) tensor
        for b in flat:
            out = np.empty((batch, SEQ_LEN + 1), np.int64)
            np.copyto(out, mm[b])
            torch.from_numpy(out)
    else:
        for b in flat:
            mm[b]
    return t.rates(flat.size)


def litdata_dir(pub, mm: np.ndarray, work: str) -> str | None:
    try:
        from litdata import TokensLoader, optimize
    except ImportError as e:
        print(f"litdata not importable ({e}); skipping LitData")
        return None
    out = os.path.join(work, f"litdata-{pub.manifest.sha256[:12]}")
    if os.path.exists(os.path.join(out, "index.json")):
        return out
    rows_per_chunk = pub.manifest.shards[0].rows  # same granularity as our shards
    starts = list(range(0, mm.shape[0], rows_per_chunk))
    optimize(fn=_litdata_rows, inputs=[(mm.filename, mm.shape[0], s, rows_per_chunk) for s in starts], output_dir=out,
             chunk_size=rows_per_chunk * (SEQ_LEN + 1), item_loader=TokensLoader(), num_workers=1,
             reorder_files=False, start_method="fork", verbose=False)
    return out


def _litdata_rows(spec):
    import torch

    path, n, start, count = spec
    mm = np.memmap(path, dtype=np.uint16, mode="r", shape=(n, SEQ_LEN + 1))
    yield torch.from_numpy(np.array(mm[start:start + count]).reshape(-1).astype(np.int16))  # 2-byte tokens, as ours


def litdata_rate(out: str, steps: int, warmup: int, batched: bool) -> tuple[float, float]:
    import torch
    from litdata import StreamingDataset, TokensLoader

    ds = StreamingDataset(out, item_loader=TokensLoader(block_size=SEQ_LEN + 1), shuffle=True, seed=0)

    def endless():  # a new epoch when one ends, like our loader
        while True:
            yield from ds

    it = endless()
    for _ in range(warmup * BATCH):
        next(it)
    t = Timer()
    for _ in range(steps):
        items = [next(it) for _ in range(BATCH)]
        if batched:  # what a trainer must do next: the loader's int64 output, one contiguous (B, 2049) tensor
            torch.stack(items).long()
    return t.rates(steps * BATCH)


# -- 3. memory ------------------------------------------------------------------------------
RSS_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from gristmill.loader import Caching, Loader, Sampling, Threads

def status():  # VmHWM is per address space; ru_maxrss would carry the parent's peak across exec
    d = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(d[k].split()[0]) / 1024 for k in ("VmHWM", "RssAnon", "RssFile")}

url, cache, steps, limit = sys.argv[2], sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5])
before = status()
caching = Caching(dir=cache) if limit is None else Caching(dir=cache, mapped_limit_bytes=limit)
with Loader(url, Sampling(order="global", global_batch=32), caching=caching, threads=Threads(prefetch=4)) as ld:
    for i, _ in enumerate(ld):
        if i + 1 == steps:
            break
    end, releases = status(), ld.page_releases
print(json.dumps({"after_imports_mb": before["VmHWM"], "peak_rss_mb": end["VmHWM"], "page_releases": releases,
                  "anon_end_mb": end["RssAnon"], "file_end_mb": end["RssFile"]}))
"""


def peak_rss(pub, cache_dir: str, steps: int, mapped_limit: int | None) -> dict:
    """``mapped_limit`` None: the Loader's default."""
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, ROOT, pub.url, cache_dir, str(steps),
                          json.dumps(mapped_limit)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- 4. mixtures ---------------------------------------------------------------------------------
def mixture_section(args) -> dict:
    from gristmill.manifests.mix_config import MixJob, mix

    n, shard_rows = args.mix_sequences, args.shard_rows
    single = dataset(args.work, f"mix-single-{n}-{shard_rows}", n, shard_rows)
    sizes = {"web": n // 2, "code": n * 3 // 10, "books": n - n // 2 - n * 3 // 10}
    parts = [dataset(args.work, f"mix-{name}-{rows}-{shard_rows}", rows, shard_rows) for name, rows in sizes.items()]
    job = MixJob.from_dict({"name": "blend", "store": os.path.join(args.work, "mix-store"), "components": [
        {"dataset": p.url, "name": name, "weight": w} for p, name, w in zip(parts, sizes, (5, 3, 2))]})
    blend = mix(job)
    cache = os.path.join(args.work, "cache")
    for pub in (single, *parts):  # the cache is content-addressed: warming each component warms the mixture
        warm_cache(pub, cache)
    steps, warmup = args.steps, 50
    loaders = {"single dataset": LoaderRun(single, cache, BATCH, warmup, 0, None),
               "mixture of 3 (5:3:2)": LoaderRun(blend, cache, BATCH, warmup, 0, None)}
    runs = {k: [] for k in loaders}
    for _ in range(args.repeats):
        for k, run in loaders.items():
            runs[k].append(run.rate(steps))
    for run in loaders.values():
        run.ld.close()
    wall = {k: max(x[0] for x in v) for k, v in runs.items()}
    cpu = {k: max(x[1] for x in v) for k, v in runs.items()}
    ratios = {f"{metric}: mixture / single": t["mixture of 3 (5:3:2)"] / t["single dataset"]
              for metric, t in (("wall", wall), ("per CPU-second", cpu))}
    print(f"\nmixture vs single dataset, warm cache, global shuffle, seq_len {SEQ_LEN}, batch {BATCH}, uint16, "
          f"workers=0, {n:,} rows each, {steps} steps, best of {args.repeats} interleaved runs:")
    print(f"  {'method':<46} {'samples/s (wall)':>17} {'samples/CPU-s':>14}")
    for k in loaders:
        print(f"  {k:<46} {wall[k]:>17,.0f} {cpu[k]:>14,.0f}")
    for k, v in ratios.items():
        print(f"    {k:<70} {v:6.2f}")
    return {"rows": n, "steps": steps, "runs_wall_and_cpu_samples_per_s": runs, "best_wall": wall,
            "best_per_cpu_second": cpu, "ratios": ratios, "mixture_sha256": blend.manifest.sha256}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=50_000)
    ap.add_argument("--shard-rows", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=600, help="timed steps of 32 per throughput run")
    ap.add_argument("--big-batch", type=int, default=256, help="the larger batch of the warm section")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold-steps", type=int, default=100)
    ap.add_argument("--cold-sequences", type=int, default=8192)
    ap.add_argument("--cold-shard-rows", type=int, default=256)
    ap.add_argument("--rss-shards", type=int, default=20, help="shards (of 250 rows) of the 1x dataset for the RSS check")
    ap.add_argument("--rss-mults", type=int, nargs="+", default=[1, 10, 100], help="dataset sizes of the RSS check, in 1x units")
    ap.add_argument("--rss-limit-mb", type=int, default=16,
                    help="mapped_limit_bytes (MiB) of the second RSS pair, below both datasets (priced in the warm section)")
    ap.add_argument("--work", default="/tmp/gristmill-bench-loader")
    ap.add_argument("--mix-sequences", type=int, default=20_000, help="rows of the mixture section's single dataset")
    ap.add_argument("--skip", nargs="*", default=[], choices=["warm", "cold", "rss", "litdata", "mixture"])
    ap.add_argument("--json", help="write all results here")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)  # 2 shared cores: intra-op threads only fight (LitData's batching uses torch ops)
    os.makedirs(args.work, exist_ok=True)
    results: dict = {"machine": "2-core shared CPU VM, no GPU", "args": vars(args)}

    if "warm" not in args.skip:
        pub = dataset(args.work, f"main-{args.sequences}-{args.shard_rows}", args.sequences, args.shard_rows)
        cache = os.path.join(args.work, "cache")
        warm_cache(pub, cache)
        mm = flat_memmap(pub, cache, args.work)
        lit = None if "litdata" in args.skip else litdata_dir(pub, mm, args.work)
        results["warm"] = {}
        for batch in (BATCH, args.big_batch):
            # The same samples at either batch size; repeat r of every method reads steps [r*steps, (r+1)*steps).
            steps, warmup = args.steps * BATCH // batch, max(2, 50 * BATCH // batch)
            flat = flat_rows(pub, batch, warmup + args.repeats * steps)
            for b in flat[:warmup]:
                mm[b]
            loaders = {f"loader {mode} workers={w}": LoaderRun(pub, cache, batch, warmup, w, dtype)
                       for mode, dtype in (("uint16", None), ("int64", torch.int64)) for w in (0, 2)}
            # what a mapped-page limit below the dataset costs: the RSS section's second setting
            loaders[f"loader uint16 workers=0 mapped_limit={args.rss_limit_mb}MiB"] = LoaderRun(
                pub, cache, batch, warmup, 0, None, args.rss_limit_mb << 20)
            window = lambda r: flat[warmup + r * steps: warmup + (r + 1) * steps]  # noqa: E731
            methods = {**{k: (lambda r, run=run: run.rate(steps)) for k, run in loaders.items()},
                       "numpy memmap gather": lambda r: memmap_rate(mm, window(r)),
                       "memmap gather + int64": lambda r: memmap_rate(mm, window(r), to_int64=True)}
            if lit and batch == BATCH:
                methods["litdata items"] = lambda r: litdata_rate(lit, args.steps, 50, batched=False)
                methods["litdata + batch"] = lambda r: litdata_rate(lit, args.steps, 50, batched=True)
            runs = {k: [] for k in methods}
            for r in range(args.repeats):
                for k, f in methods.items():
                    runs[k].append(f(r))
            for run in loaders.values():
                run.ld.close()
            wall = {k: max(x[0] for x in v) for k, v in runs.items()}
            cpu = {k: max(x[1] for x in v) for k, v in runs.items()}
            ratios = {}  # each metric compares the loader's best worker setting by that metric
            for metric, table_ in (("per CPU-second", cpu), ("wall", wall)):
                for mode in ("uint16", "int64"):
                    best = max((f"loader {mode} workers=0", f"loader {mode} workers=2"), key=lambda k: table_[k])
                    for other in methods:
                        if not other.startswith("loader"):
                            ratios[f"{metric}: {best} / {other}"] = table_[best] / table_[other]
            results["warm"][f"batch {batch}"] = {"steps": steps, "runs_wall_and_cpu_samples_per_s": runs,
                                                 "best_wall": wall, "best_per_cpu_second": cpu, "ratios": ratios}
            print(f"\nwarm cache, global shuffle, seq_len {SEQ_LEN}, batch {batch}, {steps} steps, best of "
                  f"{args.repeats} interleaved runs:")
            print(f"  {'method':<46} {'samples/s (wall)':>17} {'samples/CPU-s':>14}")
            for k in methods:
                print(f"  {k:<46} {wall[k]:>17,.0f} {cpu[k]:>14,.0f}")
            print("  ratios:")
            for k, v in ratios.items():
                print(f"    {k:<70} {v:6.2f}")

    if "cold" not in args.skip:
        # Small shards so that a pass crosses several windows: prefetch has to hide each crossing.
        cold = dataset(args.work, f"cold-{args.cold_sequences}-{args.cold_shard_rows}", args.cold_sequences,
                       args.cold_shard_rows)
        results["cold"] = {}
        for order in ("window", "global"):
            res = cold_and_warm(cold.url, steps=args.cold_steps, step_s=0.1, latency_s=0.05, bandwidth_bps=1e9,
                                order=order, window_shards=4, global_batch=BATCH, prefetch=4, workers=2, fetch_workers=8)
            results["cold"][order] = [r.__dict__ for r in res]
            print(f"\n{len(cold.manifest.shards)} shards of {args.cold_shard_rows} rows, order={order} (window_shards=4), "
                  f"50 ms/request, 1 GB/s, 100 ms step, cold then warm cache:")
            print(table(res))

    if "rss" not in args.skip:
        results["rss"] = {}
        rows = 250
        steps = args.rss_shards * rows // BATCH - 4  # 1x: just under one epoch, so both touch as many distinct rows
        for limit in (None, args.rss_limit_mb << 20):
            for mult in args.rss_mults:
                small = dataset(args.work, f"rss-{mult}x", args.rss_shards * mult * rows, rows)
                rss_cache = os.path.join(args.work, f"rss-cache-{mult}x")
                shutil.rmtree(rss_cache, ignore_errors=True)  # cold: downloads are part of the footprint
                name = "default" if limit is None else f"{args.rss_limit_mb}MiB"
                results["rss"][f"{mult}x mapped_limit={name}"] = {
                    "shards": len(small.manifest.shards), "steps": steps, "mapped_limit_bytes": limit,
                    **peak_rss(small, rss_cache, steps, limit)}
        print(f"\npeak RSS, {steps} steps of 32 x 2049 tokens, global order, cold cache, fresh process each:")
        for k, v in results["rss"].items():
            print(f"  {k:>30}: {v['shards']:>4} shards  after imports {v['after_imports_mb']:.0f} MB  "
                  f"peak {v['peak_rss_mb']:.0f} MB  releases {v['page_releases']}  at the end: anonymous {v['anon_end_mb']:.0f} MB, "
                  f"file-backed {v['file_end_mb']:.0f} MB")

    if "mixture" not in args.skip:
        results["mixture"] = mixture_section(args)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
