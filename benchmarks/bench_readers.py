"""Decoding speed and memory of the input readers on hostile-shaped input (issue 26).

    flock /tmp/gristmill-heavy.lock .venv/bin/python benchmarks/bench_readers.py [--readers PATH] [--mb 200]

``--readers``: the pipeline/readers.py to measure (default this checkout's; e.g. main's, to see
the before). It is loaded as a module of its own (its only imports are fsspec and, for WARC,
``.html`` inside functions), so two versions can be compared from one virtual environment.

Measured, side by side in one process: MB/s of uncompressed bytes handed out by
``open_stream`` for one ``--mb``-MB JSONL of a repeated record, compressed as zstd (level 19) and
gzip (level 9): high ratios (thousands to one), the shape of a decompression bomb. Then the
peak traced memory (tracemalloc) of ``read_jsonl`` over a gzip holding one 256 MiB line with
``max_record_bytes`` 4 MiB (only where the readers have that limit).
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import inspect
import json
import os
import tempfile
import time
import tracemalloc
import zlib

import zstandard


def load(path: str):
    spec = importlib.util.spec_from_file_location("readers_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def speed(mod, path: str) -> float:
    with open(path, "rb") as f:
        t0, n = time.perf_counter(), 0
        for line in mod.open_stream(f, path):
            n += len(line)
        return n / 1e6 / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readers", default=os.path.join(os.path.dirname(__file__), "..", "pipeline", "readers.py"))
    ap.add_argument("--mb", type=int, default=200)
    a = ap.parse_args()
    mod = load(a.readers)
    record = json.dumps({"text": "the same words again and again " * 30}).encode() + b"\n"
    data = record * (a.mb * 1_000_000 // len(record))
    out = {"readers": os.path.abspath(a.readers), "uncompressed_mb": round(len(data) / 1e6, 1)}
    with tempfile.TemporaryDirectory() as tmp:
        for suffix, raw in ((".zst", zstandard.ZstdCompressor(level=19).compress(data)), (".gz", gzip.compress(data, 9))):
            p = os.path.join(tmp, f"a.jsonl{suffix}")
            with open(p, "wb") as f:
                f.write(raw)
            out[suffix] = {"compressed_bytes": len(raw), "ratio": round(len(data) / len(raw)),
                           "mb_per_s": round(max(speed(mod, p) for _ in range(2)), 1)}
        out["zstd_over_gzip"] = round(out[".zst"]["mb_per_s"] / out[".gz"]["mb_per_s"], 2)
        if "max_record_bytes" in inspect.signature(mod.read_jsonl).parameters:
            z = zlib.compressobj(9, zlib.DEFLATED, 31)
            parts, chunk = [z.compress(b'{"text": "')], b"a" * (1 << 20)
            parts += [z.compress(chunk) for _ in range(256)]
            parts += [z.compress(b'"}\n{"text": "after"}\n'), z.flush()]
            p = os.path.join(tmp, "bomb.jsonl.gz")
            with open(p, "wb") as f:
                f.write(b"".join(parts))
            tracemalloc.start()
            recs = [r.get("reason") for r in mod.read_jsonl(p, "text", None, max_record_bytes=4 << 20)]
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            out["line_bomb"] = {"compressed_bytes": os.path.getsize(p), "line_mib": 256, "limit_mib": 4,
                                "records": recs, "peak_traced_mib": round(peak / 2 ** 20, 1)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
