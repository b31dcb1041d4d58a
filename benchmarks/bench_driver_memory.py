"""The driver's peak memory against the partition count, the data fixed (issue 32, target 5).

    .venv/bin/python benchmarks/bench_driver_memory.py [--partitions 100 1000] [--trace] [--out bench-out/drvmem]

Start it without flock: it takes /tmp/gristmill-heavy.lock itself around each run.

The issue's target is the driver's peak RSS flat (within 15%) from 200 MB to 2 GB of input; what
grows with the input in the driver is the partition count (93 -> 987 partitions there). This
measures that growth without 2 GB of data: bench_partitions.py's corpus (tests/corpus_split.py,
equal-sized JSONL files, by default 1,000 files of 2 documents) grouped into P partitions by
``partitioning.partition_bytes``, the same job at every P (bench_partitions' stages plus the Gopher
quality rules), local runner, 2 workers.

Each run is a fresh process. Without ``--trace``: ``gristmill prepare`` itself, its VmRSS read every
0.1 s from /proc and its VmHWM at the end (``driver_peak_mb``), with the step the peak came in.
With ``--trace``: the same CLI run in-process by a wrapper (``_traced_child``) under ``tracemalloc``
(the driver only: the workers are spawned without it), its traced heap at the end of every stage
(``Context.run``) and of publish, its exact peak inside each (``tracemalloc.reset_peak`` at each
start), and a snapshot at each new traced peak seen every 0.2 s; printed: the traced peak, the heap
at each stage's end, the peak inside each, and the top allocation sites (file:line) of the peak
snapshot. tracemalloc's own bookkeeping inflates the RSS of a traced run: its RSS is not the number
to compare.

``--throughput-corpus DIR...`` runs bench_throughput.py's job (every stage, its corpus: ``build
--size-mb N``) instead, e.g. on the 200 MB and 2 GB builds: the issue's own measurement, with the
sites. The RSS is also split: ``anon_peak_mb`` (RssAnon: the heaps) against the mapped files.

Results: docs/benchmarks.md, "Driver memory against the partition count".
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)

from bench_partitions import STEP_LINE, corpus, job_dict, write_job  # noqa: E402
from bench_vs_datatrove import heavy_lock  # noqa: E402
from ray_cluster import GRISTMILL  # noqa: E402


def _proc_kb(pid: int, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    return 0


def run_one(info: dict, out: str, partitions: int, trace: bool, top: int, lock: bool = True,
            throughput: str | None = None, keep: bool = False) -> dict:
    run_root = os.path.join(out, f"{'T' + os.path.basename(throughput) if throughput else 'P'}{partitions}"
                                 f"{'-trace' if trace else ''}")
    shutil.rmtree(run_root, ignore_errors=True)
    if throughput:  # bench_throughput.py's corpus and job (every stage), its own partitioning
        from bench_throughput import ensure_tokenizer, gristmill_job

        job = gristmill_job(throughput, run_root, ensure_tokenizer(throughput), 2)  # trained once per corpus
        if partitions:
            job["partitioning"] = {"partition_bytes": partitions}
    else:
        job = job_dict(info, run_root, partitions, 2, "local")
        job["quality"] = {"c4": {"enabled": False}}  # the issue-32 job's Gopher rules: a stage more per partition
    path = write_job(os.path.join(run_root, "job.yaml"), job)
    trace_out = os.path.join(run_root, "trace.json")
    cmd = ([sys.executable, os.path.abspath(__file__), "--traced-child", path, trace_out, str(top)] if trace
           else [*GRISTMILL, "prepare", path])
    err_path = os.path.join(run_root, "stderr.log")
    samples: list[tuple[float, int]] = []
    lines: list[tuple[float, str]] = []
    with heavy_lock() if lock else contextlib.nullcontext(), open(err_path, "w") as err:
        t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})

        def read():
            for line in proc.stderr:
                err.write(line)
                lines.append((time.perf_counter() - t0, line.strip()))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        hwm = anon = 0
        while proc.poll() is None:
            samples.append((time.perf_counter() - t0, _proc_kb(proc.pid, "VmRSS")))
            anon = max(anon, _proc_kb(proc.pid, "RssAnon"))
            hwm = max(hwm, _proc_kb(proc.pid, "VmHWM"))
            time.sleep(0.1)
        reader.join()
        wall = time.perf_counter() - t0
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the driver and its (waited-for) workers
        cpu = ru.ru_utime - ru0.ru_utime + ru.ru_stime - ru0.ru_stime
    if proc.returncode:
        raise SystemExit(f"P={partitions}: exited {proc.returncode}; see {err_path}")
    t_peak, peak = max(samples, key=lambda s: s[1])
    # the step under way at the peak: the last progress line before it
    step = next((m.group(1) for t, ln in reversed(lines) if t <= t_peak and (m := STEP_LINE.match(ln))), "start")
    # the largest RSS inside each step (its progress lines to the next step's; "publish" after the last)
    by_step: dict[str, float] = {}
    marks = [(t, m.group(1)) for t, ln in lines if (m := STEP_LINE.match(ln))]
    for t, kb in samples:
        name = next((s for ts, s in reversed(marks) if ts <= t), "start")
        if marks and t > marks[-1][0] + 1.0 and name == marks[-1][1]:
            name = f"after {name}"  # the last step's line, then publish (no line of its own)
        by_step[name] = max(by_step.get(name, 0.0), kb / 1024)
    (report,) = glob.glob(os.path.join(run_root, "work", "*", "report.json"))
    with open(report) as f:
        rep = json.load(f)
    # "[prepare] F input files in P partitions; ..." (Executor.run's first line)
    partitions = next(int(m.group(1)) for _, ln in lines if (m := re.search(r"input files in (\d+) partitions", ln)))
    res = {"partitions": partitions, "trace": trace, "wall_s": wall, "cpu_s": cpu, "rss_peak_mb": peak / 1024, "hwm_mb": hwm / 1024,
           "anon_peak_mb": anon / 1024,
           "peak_at_s": t_peak, "peak_step": step, "rss_by_step_mb": by_step, "manifest_sha256": rep["manifest_sha256"],
           "accounting": rep["accounting"], "utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if trace:
        with open(trace_out) as f:
            res["traced"] = json.load(f)
    if not keep:  # kept: a resumed run (the same command) then repeats only the publish
        shutil.rmtree(os.path.join(run_root, "work"), ignore_errors=True)
        shutil.rmtree(os.path.join(run_root, "store"), ignore_errors=True)
    return res


def _traced_child(job: str, out: str, top: int) -> None:
    """``gristmill prepare job`` in this process under tracemalloc: the heap at each stage's end and
    the top allocation sites at the traced peak, written to ``out`` as JSON."""
    import tracemalloc

    tracemalloc.start(8)
    from gristmill.cli import main
    from gristmill.pipeline.stages import base

    state = {"peak": 0, "snap": None, "stage": "start", "ends": [], "peaks": []}
    lock = threading.Lock()

    def maybe_snapshot():
        cur, _ = tracemalloc.get_traced_memory()
        with lock:
            if cur > state["peak"] * 1.02 + 1e6:  # a new peak: keep its snapshot
                state["peak"], state["snap"], state["at"] = cur, tracemalloc.take_snapshot(), state["stage"]

    from gristmill.pipeline import executor

    def phase(name: str, fn):
        """``fn`` as phase ``name``: the traced heap's peak inside it (reset at its start: exact, not
        sampled) and at its end."""
        state["peaks"].append({"phase": state["stage"], "peak_mb": tracemalloc.get_traced_memory()[1] / 1e6})
        state["stage"] = name
        tracemalloc.reset_peak()
        try:
            return fn()
        finally:
            maybe_snapshot()
            cur, pk = tracemalloc.get_traced_memory()
            state["ends"].append({"stage": name, "traced_mb": cur / 1e6, "peak_mb": pk / 1e6})
            tracemalloc.reset_peak()
            state["stage"] = f"after {name}"

    run, publish = base.Context.run, executor.Executor._publish
    base.Context.run = lambda self, stage: phase(stage.name, lambda: run(self, stage))
    executor.Executor._publish = lambda self, *a, **k: phase("publish", lambda: publish(self, *a, **k))
    stop = threading.Event()

    def watch():
        while not stop.wait(0.2):
            maybe_snapshot()

    threading.Thread(target=watch, daemon=True).start()
    sys.argv = ["gristmill", "prepare", job]
    try:
        main()
    except SystemExit as e:
        if e.code:
            raise
    stop.set()
    peak = max([tracemalloc.get_traced_memory()[1]] + [e["peak_mb"] * 1e6 for e in state["ends"] + state["peaks"]])
    snap = state["snap"].filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    sites = [{"mb": s.size / 1e6, "count": s.count, "where": str(s.traceback[0])}
             for s in snap.statistics("lineno")[:top]]
    stacks = [{"mb": s.size / 1e6, "count": s.count, "stack": s.traceback.format()[-8:]}
              for s in snap.statistics("traceback")[:5]]
    with open(out, "w") as f:
        json.dump({"traced_peak_mb": peak / 1e6, "snapshot_mb": state["peak"] / 1e6, "snapshot_in": state.get("at"),
                   "stage_ends": state["ends"], "top_sites": sites, "top_stacks": stacks}, f, indent=1)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--traced-child":
        _traced_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--paragraphs", type=int, default=6)
    ap.add_argument("--trace", action="store_true", help="tracemalloc in the driver (its RSS is then inflated)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out", "drvmem"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--throughput-corpus", nargs="+", metavar="DIR",
                    help="instead: bench_throughput.py's job on these corpora (its build), partitioning as given by "
                         "--partition-bytes (default the job's)")
    ap.add_argument("--partition-bytes", type=int, default=0)
    ap.add_argument("--no-lock", action="store_true", help="without the shared lock (a smoke run of a few CPU-seconds)")
    ap.add_argument("--keep", action="store_true", help="keep each run's work dir and store (to rerun its publish)")
    a = ap.parse_args()
    os.environ.setdefault("GRISTMILL_CODE_VERSION", "bench_driver_memory")  # the same manifest hash at every P
    for p in a.partitions:
        if a.files % p:
            ap.error(f"--partitions {p} must divide --files {a.files}")
    os.makedirs(a.out, exist_ok=True)
    if a.throughput_corpus:
        info, runs = {"throughput": a.throughput_corpus}, [(a.partition_bytes, os.path.abspath(c)) for c in a.throughput_corpus]
    else:
        info = corpus(os.path.abspath(a.out), a.files, a.docs, a.paragraphs)
        print(f"corpus: {info['docs']:,} documents, {info['text_bytes'] / 1e6:.1f} MB of text in {info['files']:,} files")
        runs = [(p, None) for p in a.partitions]
    results = []
    for p, tp in runs:
        r = run_one(info, os.path.abspath(a.out), p, a.trace, a.top, not a.no_lock, tp, a.keep)
        p = r["partitions"]
        results.append(r)
        print(f"{'corpus ' + tp + ', ' if tp else ''}P={p:>5}: driver peak RSS {r['rss_peak_mb']:.0f} MB (VmHWM {r['hwm_mb']:.0f}, RssAnon {r['anon_peak_mb']:.0f}) in {r['peak_step']} at "
              f"{r['peak_at_s']:.1f}/{r['wall_s']:.1f} s ({r['cpu_s']:.0f} CPU-s); manifest {r['manifest_sha256'][:12]}", flush=True)
        print("  largest RSS in each step (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in r["rss_by_step_mb"].items()))
        if t := r.get("traced"):
            print(f"  traced heap: peak {t['traced_peak_mb']:.1f} MB (snapshot {t['snapshot_mb']:.1f} MB in "
                  f"{t['snapshot_in']}); at stage ends: "
                  + ", ".join(f"{e['stage']} {e['traced_mb']:.1f}" for e in t["stage_ends"]))
            print("  traced heap's peak inside each: " + ", ".join(f"{e['stage']} {e['peak_mb']:.1f}" for e in t["stage_ends"]))
            for s in t["top_sites"]:
                print(f"    {s['mb']:8.2f} MB {s['count']:>8}  {s['where']}")
    base = results[0]
    for r in results[1:]:
        print(f"P={r['partitions']} / P={base['partitions']}: driver peak RSS {r['rss_peak_mb'] / base['rss_peak_mb']:.2f}x"
              f"; same manifest: {r['manifest_sha256'] == base['manifest_sha256']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"corpus": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
