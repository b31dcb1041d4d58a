"""The loader's targets, measured side by side in one run (see docs/benchmarks.md).

1. Warm cache, global shuffle, seq_len 2048, batches of 32: samples/s of the Loader (int64
   ``input_ids`` + ``labels`` ready for a trainer) against
   - the ceiling: a raw numpy memmap gather of the same rows in the same order (uint16, no
     conversion, order precomputed outside the timer);
   - LitData ``StreamingDataset(shuffle=True)`` over the same tokens (``TokensLoader``,
     block 2049), both bare item iteration and iteration plus the same batch formation.
   Methods run interleaved, ``--repeats`` times; each one's best run is quoted, since the
   machine is shared and noisy.
2. Cold cache behind a simulated store (``gmsim://``) with 50 ms per request and 1 GB/s,
   100 ms per step: the input wait after the first batch as a fraction of step time (window
   and global order), on small shards so a pass crosses several windows.
3. Peak RSS of a fresh process running the loader (global order, cold cache) over 1x and 10x
   the shards, for the same number of steps (just under one epoch of the 1x dataset).

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

from loader import Loader  # noqa: E402
from loader.bench import cold_and_warm, synthetic_dataset, table  # noqa: E402
from manifests import load_manifest  # noqa: E402

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
    pub = synthetic_dataset(root, sequences=sequences, seq_len=SEQ_LEN, shard_rows=shard_rows)
    print(f"built {name}: {sequences:,} sequences in {len(pub.manifest.shards)} shards ({time.perf_counter() - t:.1f}s)")
    return pub


def warm_cache(pub, cache_dir: str) -> None:
    rows = pub.manifest.shards[0].rows
    with Loader(pub, order="sequential", global_batch=rows, epochs=1, cache_dir=cache_dir, prefetch=1) as ld:
        for _ in ld:
            pass


# -- 1. warm throughput --------------------------------------------------------------------
def loader_rate(pub, cache_dir: str, steps: int, warmup: int, workers: int) -> tuple[float, float]:
    with Loader(pub, order="global", seed=0, global_batch=BATCH, cache_dir=cache_dir, workers=workers, prefetch=8) as ld:
        it = iter(ld)
        for _ in range(warmup):  # includes the once-per-process re-hash of every cached shard
            next(it)
        t = Timer()
        for _ in range(steps):
            next(it)
        return t.rates(steps * BATCH)


def flat_memmap(pub, cache_dir: str, work: str) -> np.ndarray:
    """All rows of the split in one (N, seq_len + 1) uint16 file: the simplest possible reader."""
    from manifests import MappedShard

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


def memmap_rate(pub, mm: np.ndarray, steps: int, warmup: int, to_int64: bool = False) -> tuple[float, float]:
    from loader.order import Order

    o = Order(pub.manifest, "train", 0, "global")
    shards, rows = o.locate(np.arange((warmup + steps) * BATCH))
    flat = (o.offsets[np.searchsorted(o.shard_ids, shards)] + rows).reshape(-1, BATCH)
    for b in flat[:warmup]:
        mm[b]
    t = Timer()
    if to_int64:  # the same output as the loader: contiguous int64 inputs and labels
        import torch

        for b in flat[warmup:]:
            x = mm[b]
            ids, labels = torch.empty((BATCH, SEQ_LEN), dtype=torch.long), torch.empty((BATCH, SEQ_LEN), dtype=torch.long)
            np.copyto(ids.numpy(), x[:, :-1])
            np.copyto(labels.numpy(), x[:, 1:])
    else:
        for b in flat[warmup:]:
            mm[b]
    return t.rates(steps * BATCH)


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
        if batched:  # what a trainer must do next: one batch, int64, inputs and labels shifted by one
            x = torch.stack(items)
            input_ids, labels = x[:, :-1].long().contiguous(), x[:, 1:].long().contiguous()
    return t.rates(steps * BATCH)


# -- 3. memory ------------------------------------------------------------------------------
RSS_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from loader import Loader

def status():  # VmHWM is per address space; ru_maxrss would carry the parent's peak across exec
    d = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(d[k].split()[0]) / 1024 for k in ("VmHWM", "RssAnon", "RssFile")}

url, cache, steps = sys.argv[2], sys.argv[3], int(sys.argv[4])
before = status()
with Loader(url, order="global", global_batch=32, cache_dir=cache, prefetch=4) as ld:
    for i, _ in enumerate(ld):
        if i + 1 == steps:
            break
    end = status()
print(json.dumps({"after_imports_mb": before["VmHWM"], "peak_rss_mb": end["VmHWM"],
                  "anon_end_mb": end["RssAnon"], "file_end_mb": end["RssFile"]}))
"""


def peak_rss(pub, cache_dir: str, steps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, ROOT, pub.url, cache_dir, str(steps)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=50_000)
    ap.add_argument("--shard-rows", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=600, help="timed steps per throughput run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold-steps", type=int, default=100)
    ap.add_argument("--cold-sequences", type=int, default=8192)
    ap.add_argument("--cold-shard-rows", type=int, default=256)
    ap.add_argument("--rss-shards", type=int, default=20, help="shards (of 250 rows) of the 1x dataset for the RSS check")
    ap.add_argument("--work", default="/tmp/gristmill-bench-loader")
    ap.add_argument("--skip", nargs="*", default=[], choices=["warm", "cold", "rss", "litdata"])
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
        methods = {"loader workers=0": lambda: loader_rate(pub, cache, args.steps, 50, 0),
                   "loader workers=2": lambda: loader_rate(pub, cache, args.steps, 50, 2),
                   "numpy memmap gather": lambda: memmap_rate(pub, mm, args.steps, 50),
                   "memmap gather + int64": lambda: memmap_rate(pub, mm, args.steps, 50, to_int64=True)}
        if lit:
            methods["litdata items"] = lambda: litdata_rate(lit, args.steps, 50, batched=False)
            methods["litdata + batch"] = lambda: litdata_rate(lit, args.steps, 50, batched=True)
        runs = {k: [] for k in methods}
        for _ in range(args.repeats):
            for k, f in methods.items():
                runs[k].append(f())
        wall = {k: max(r[0] for r in v) for k, v in runs.items()}
        cpu = {k: max(r[1] for r in v) for k, v in runs.items()}
        ratios = {}  # each metric compares the loader's best setting by that metric
        for metric, table_ in (("per CPU-second", cpu), ("wall", wall)):
            best_loader = max(("loader workers=0", "loader workers=2"), key=lambda k: table_[k])
            for other in methods:
                if not other.startswith("loader"):
                    ratios[f"{metric}: {best_loader} / {other}"] = table_[best_loader] / table_[other]
        results["warm"] = {"runs_wall_and_cpu_samples_per_s": runs, "best_wall": wall, "best_per_cpu_second": cpu,
                           "ratios": ratios}
        print(f"\nwarm cache, global shuffle, seq_len {SEQ_LEN}, batch {BATCH}, best of {args.repeats} interleaved runs:")
        print(f"  {'method':<24} {'samples/s (wall)':>17} {'samples/CPU-s':>14}")
        for k in methods:
            print(f"  {k:<24} {wall[k]:>17,.0f} {cpu[k]:>14,.0f}")
        print("  ratios:")
        for k, v in ratios.items():
            print(f"    {k:<62} {v:6.2f}")

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
        for mult in (1, 10):
            small = dataset(args.work, f"rss-{mult}x", args.rss_shards * mult * rows, rows)
            rss_cache = os.path.join(args.work, f"rss-cache-{mult}x")
            shutil.rmtree(rss_cache, ignore_errors=True)  # cold: downloads are part of the footprint
            results["rss"][f"{mult}x"] = {"shards": len(small.manifest.shards), "steps": steps,
                                          **peak_rss(small, rss_cache, steps)}
        print(f"\npeak RSS, {steps} steps of 32 x 2049 tokens, global order, cold cache, fresh process each:")
        for k, v in results["rss"].items():
            print(f"  {k:>3}: {v['shards']:>4} shards  after imports {v['after_imports_mb']:.0f} MB  "
                  f"peak {v['peak_rss_mb']:.0f} MB  at the end: anonymous {v['anon_end_mb']:.0f} MB, "
                  f"file-backed {v['file_end_mb']:.0f} MB")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
