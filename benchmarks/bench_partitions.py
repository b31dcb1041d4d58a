"""How `gristmill prepare` cost grows with the partition count, the data fixed (issue 23, target 1).

    .venv/bin/python benchmarks/bench_partitions.py [--partitions 8 250 1000 4000] [--runner auto|local|ray] [--budget-s 0] [--out bench-out/partitions]

Start it without flock: it takes /tmp/gristmill-heavy.lock itself around each run (the wait is not timed).

The data: one fixed English corpus (tests/corpus_split.py; default 8,000 documents of 13 paragraphs
of Python's documentation, ~26 MB of text, 5% exact and 5% near duplicates planted) written once as
4,000 JSONL files of equal size. Partition count P is chosen with ``partitioning.partition_bytes = (4000 / P)
x file size``: every run reads the same files, so the document ids, the removals and the manifest
are the same; only the tasks change. The job runs every per-partition step the issue names:
extract + language ID, exact dedup, fuzzy dedup (0.8), decontamination against a small eval set and
the 5% validation split, PII, tokenizer training, tokenize, pack.

Each run is one fresh `gristmill prepare` process (``runner.kind`` from ``--runner``: ``auto``, the
local runner here, or ``ray``, an embedded Ray; ``runner.num_cpus`` 2) with a fresh work dir; the files
it left in its run dir are counted (``work_files``, benchmarks/workdir_files.py) before it is removed. Printed per P: partitions, tasks (completion markers), whole wall time (process start to exit)
and its ratio to the first P, the wall time of every step (the progress line each step ends with),
and orchestration per task two ways: the marginal wall time per added task against the first P
((wall(P) - wall(P0)) / (tasks(P) - tasks(P0)): the data is the same, so the difference is what the
extra tasks cost), and (wall x CPUs - the tasks' own CPU seconds) / tasks.

``--budget-s S`` stops a run after S seconds (kill -9 of its process group) and projects the step it
was in from that step's rate so far (tasks done per second, from its progress lines): used for the
baseline where P=1000/4000 would take hours. A projected number is marked ``~`` and says so.

``--extract-rate SCALE`` only measures, in this process, extract + language ID of the demo corpus's
WARC file and HTML main-content extraction (resiliparse) of full-size pages (pydoc's HTML of 17
standard-library modules, ~100 KB each): the per-byte rates docs/scaling.md plans a crawl with.

``--tables A.json B.json`` prints the tables of earlier runs (``--json``) together, the first run's P as
the base: how a budgeted baseline is put beside a full run.

``--kill-trials N --kill worker|node`` replaces the scaling runs with the reliability target
(target 2): N trials, each a fresh two-node local Ray cluster (tests/ray_cluster.py), the job
submitted through the Ray Jobs API, and mid-stage either one worker process running a task is
killed with SIGKILL (``worker``) or the second node's raylet is (``node``), in a different step
from trial to trial (``KILL_AFTER``: the first task, fuzzy bands, decontamination, PII, tokenize). A trial passes when the
job succeeds on its first submission with the reference manifest hash (one uninterrupted embedded
run of the same job) and balanced accounting.

Results: docs/benchmarks.md, "Partitions, workers and nodes (issue 23)".
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # corpus_split, ray_cluster: shared with the tests

from bench_vs_datatrove import TreeRSS, heavy_lock  # noqa: E402  (summed RSS of a process tree; the shared lock)
from corpus_split import write_split_corpus  # noqa: E402
from ray_cluster import GRISTMILL  # noqa: E402  (this interpreter: the venv's scripts may run another python)
from workdir_files import count_files  # noqa: E402  (issue 32: files a run leaves per partition)

# "[step] [####....] 12/250 tasks  3.4s ..." (pipeline.progress.Progress.line)
STEP_LINE = re.compile(r"^\[([\w.]+)\] \[[#.]+\] (\d+)/(\d+) tasks\s+([\d,.]+)s")


def corpus(out: str, files: int, docs: int, paragraphs: int) -> dict:
    root = os.path.join(out, "corpus")
    stamp = os.path.join(out, "corpus.json")
    want = {"files": files, "docs": docs, "paragraphs": paragraphs}
    if os.path.exists(stamp):
        with open(stamp) as f:
            info = json.load(f)
        if info["want"] == want:
            return info
    shutil.rmtree(root, ignore_errors=True)
    info = write_split_corpus(root, files=files, docs_per_file=docs // files, paragraphs_per_doc=paragraphs)
    info = {**info, "want": want, "root": root, "input_bytes": info["file_bytes"] * files}
    info.pop("truth")
    eval_path = os.path.join(out, "evals.jsonl")
    with open(eval_path, "w") as f:  # a few sentences of the corpus's own kind: decontamination finds some
        from gristmill.pipeline.demo_corpus import stdlib_paragraphs

        for i, p in enumerate(stdlib_paragraphs()[::400]):
            f.write(json.dumps({"id": f"q{i}", "text": p}) + "\n")
    info["evals"] = eval_path
    with open(stamp, "w") as f:
        json.dump(info, f)
    return info


def job_dict(info: dict, run_dir: str, partitions: int, num_cpus: int, runner: str = "auto") -> dict:
    per = info["files"] // partitions
    return {
        "inputs": [os.path.join(info["root"], "*.jsonl")],
        "output": {"store": os.path.join(run_dir, "store"), "dataset": "parts", "report_html": False},
        "work_dir": os.path.join(run_dir, "work"),
        "language": {"allowed": ["en"], "threshold": 0.3},
        "fuzzy_dedup": {"threshold": 0.8},
        "decontaminate": {"eval_sets": [{"name": "qa", "path": info["evals"], "id_field": "id"}]},
        "split": {"validation_fraction": 0.05},
        "tokenizer": {"vocab_size": 2048, "sample_bytes": 1_000_000},
        "pack": {"seq_len": 256, "shard_bytes": 4_000_000},
        "runner": {"kind": runner, "num_cpus": num_cpus}, "partitioning": {"partition_bytes": per * info["file_bytes"]},
    }


def write_job(path: str, job: dict) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        yaml.safe_dump(job, f)
    return path


def parse_steps(stderr: str) -> dict[str, dict]:
    """step -> {"done", "total", "seconds"} from the progress lines (a step's last line is its total;
    a step that runs again, like fuzzy dedup's components once per half-round, adds its runs: a run
    starts where the elapsed time goes back)."""
    steps: dict[str, dict] = {}
    for line in stderr.splitlines():
        if m := STEP_LINE.match(line.strip()):
            name, done, total, secs = m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4).replace(",", ""))
            prev = steps.get(name, {"elapsed": 0.0, "earlier": 0.0})
            earlier = prev["earlier"] + (prev["elapsed"] if secs < prev["elapsed"] else 0.0)
            steps[name] = {"done": done, "total": total, "elapsed": secs, "earlier": earlier}
    return {k: {"done": v["done"], "total": v["total"], "seconds": v["earlier"] + v["elapsed"]} for k, v in steps.items()}


def markers(run_root: str) -> dict[str, dict]:
    """step -> {"tasks", "task_s", "cpu_s"}: the completion markers, with each task's own time."""
    from gristmill.pipeline.workdir import WorkDir

    out: dict[str, dict] = {}
    for done in glob.glob(os.path.join(run_root, "work", "*", "_done")):
        wd = WorkDir(os.path.dirname(done))
        for step in os.listdir(done):  # task markers and batch markers (one per batch of tasks)
            stats = list(wd.finished(step).values())
            out[step] = {"tasks": len(stats), "task_s": sum(float(s.get("_seconds", 0.0)) for s in stats),
                         "cpu_s": sum(float(s.get("_cpu_seconds", 0.0)) for s in stats)}
    return out


class DriverPeak(TreeRSS):
    """The driver process's own peak RSS (its VmHWM), read while it lives."""

    def _sample(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        return 0


def run_one(info: dict, out: str, partitions: int, num_cpus: int, budget_s: float, runner: str = "auto") -> dict:
    run_root = os.path.join(out, f"P{partitions}")
    shutil.rmtree(run_root, ignore_errors=True)
    job = write_job(os.path.join(run_root, "job.yaml"), job_dict(info, run_root, partitions, num_cpus, runner))
    err_path = os.path.join(run_root, "stderr.log")
    with heavy_lock(), open(err_path, "w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([*GRISTMILL, "prepare", job], stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        with TreeRSS(proc.pid, every=0.5) as tree, DriverPeak(proc.pid, every=0.5) as driver:
            try:
                stdout, _ = proc.communicate(timeout=budget_s or None)
                stopped = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the driver, its embedded Ray and the workers
                stdout, _ = proc.communicate()
                stopped = True
            wall = time.perf_counter() - t0
    with open(err_path) as f:
        stderr = f.read()
    steps = parse_steps(stderr)
    per_step = markers(run_root)
    res = {"partitions": partitions, "wall_s": wall, "steps": steps, "tasks": sum(v["tasks"] for v in per_step.values()),
           "task_seconds": sum(v["task_s"] for v in per_step.values()),
           "task_cpu_seconds": sum(v["cpu_s"] for v in per_step.values()), "markers": per_step,
           "stopped": stopped, "rc": proc.returncode, "tree_peak_mb": tree.peak / 2**20, "driver_peak_mb": driver.peak / 2**20,
           "utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit()}
    if stopped:
        # the step under way when the budget ran out: its rate so far, projected to all its tasks
        cur = [s for s, v in steps.items() if v["done"] < v["total"]]
        if cur:
            v = steps[cur[-1]]
            res["projected"] = {"step": cur[-1], "done": v["done"], "total": v["total"], "elapsed_s": v["seconds"],
                                "step_s": v["seconds"] / max(v["done"], 1) * v["total"]}
    else:
        if proc.returncode != 0:
            raise SystemExit(f"P={partitions}: prepare exited {proc.returncode}:\n{stderr[-3000:]}")
        (report,) = glob.glob(os.path.join(run_root, "work", "*", "report.json"))
        with open(report) as f:
            rep = json.load(f)
        res["manifest_sha256"] = rep["manifest_sha256"]
        res["accounting"] = rep["accounting"]
        res["work_files"] = sum(count_files(os.path.dirname(report)).values())
    shutil.rmtree(os.path.join(run_root, "work"), ignore_errors=True)  # 4,000 partitions write ~10^5 files
    shutil.rmtree(os.path.join(run_root, "store"), ignore_errors=True)
    return res


def _commit() -> str:
    done = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def print_scaling(info: dict, runs: list[dict], num_cpus: int) -> None:
    print(f"corpus: {info['docs']:,} documents, {info['text_bytes'] / 1e6:.1f} MB of text, {info['files']:,} files of "
          f"{info['file_bytes']:,} B; runner.num_cpus {num_cpus}; {platform.node()} {os.cpu_count()} CPUs; "
          f"runs at {', '.join(sorted({r.get('utc', '?') + ' (' + r.get('commit', '?') + ')' for r in runs}))}")
    base = runs[0]
    print(f"{'P':>6}{'tasks':>8}{'wall s':>10}{'x P0':>7}{'ms/added task':>15}{'orch ms/task':>14}{'driver MB':>11}"
          f"{'tree MB':>9}{'files/P':>9}  hash")
    for r in runs:
        mark = "~" if r["stopped"] else ""
        wall = r["wall_s"]
        marginal = ((wall - base["wall_s"]) / (r["tasks"] - base["tasks"]) * 1e3
                    if r is not base and not r["stopped"] and r["tasks"] > base["tasks"] else None)
        orch = (wall * num_cpus - r["task_cpu_seconds"]) / r["tasks"] * 1e3 if r["tasks"] and not r["stopped"] else None
        same = ("stopped" if r["stopped"] else
                "same" if r.get("manifest_sha256") == base.get("manifest_sha256") else "DIFFERENT")
        ratio = (">" if r["stopped"] else "") + format(wall / base["wall_s"], ".1f")
        print(f"{r['partitions']:>6}{r['tasks']:>8}{mark + format(wall, ',.1f'):>10}{ratio:>7}"
              f"{'' if marginal is None else format(marginal, '.1f'):>15}{'' if orch is None else format(orch, '.1f'):>14}"
              f"{r.get('driver_peak_mb', 0):>11,.0f}{r.get('tree_peak_mb', 0):>9,.0f}"
              f"{format(r['work_files'] / r['partitions'], '.2f') if 'work_files' in r else '':>9}"
              f"  {same} {r.get('manifest_sha256', '')[:12]}")
    names = list(dict.fromkeys(s for r in runs for s in r["steps"]))
    print("\nstep wall seconds (the step's own progress line; ~ = projected from its rate when the run was stopped)")
    print(f"{'step':<34}" + "".join(f"{'P=' + str(r['partitions']):>12}" for r in runs))
    for s in names:
        cells = []
        for r in runs:
            v = r["steps"].get(s)
            p = r.get("projected")
            if p and p["step"] == s:
                cells.append(f"~{p['step_s']:,.0f}")
            elif v is None:
                cells.append("-")
            else:
                cells.append(f"{v['seconds']:,.1f}")
        print(f"{s:<34}" + "".join(f"{c:>12}" for c in cells))
    print("\ntasks / task-seconds per step (each task's own time from its marker; the work, without orchestration)")
    print(f"{'step':<34}" + "".join(f"{'P=' + str(r['partitions']):>16}" for r in runs))
    for s in names:
        cells = [f"{v['tasks']}/{v['task_s']:,.1f}" if (v := r.get("markers", {}).get(s)) else "-" for r in runs]
        print(f"{s:<34}" + "".join(f"{c:>16}" for c in cells))
    for r in runs:
        if p := r.get("projected"):
            print(f"P={r['partitions']}: stopped after {r['wall_s']:.0f} s in {p['step']} at {p['done']}/{p['total']} tasks "
                  f"({p['elapsed_s']:.0f} s): that step alone projects to ~{p['step_s']:,.0f} s")


# -- kill trials -------------------------------------------------------------------------------------
# Kill points, one per trial in turn: once a task of this step has committed (None: the first task
# found running), kill the worker running a task, or the second node's raylet while one runs there.
KILL_AFTER = (None, "fuzzy_dedup.bands", "decontaminate", "pii", "tokenize")


def kill_trials(info: dict, out: str, trials: int, what: str) -> list[dict]:
    from ray_cluster import kill_mid_stage_and_wait, ray_cluster, submit_prepare

    ref_root = os.path.join(out, "kill-reference")
    shutil.rmtree(ref_root, ignore_errors=True)
    ref_job = write_job(os.path.join(ref_root, "job.yaml"), job_dict(info, ref_root, 8, 2))
    with heavy_lock():
        done = subprocess.run([*GRISTMILL, "prepare", ref_job], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the reference run failed:\n{done.stderr[-3000:]}")
    (report,) = glob.glob(os.path.join(ref_root, "work", "*", "report.json"))
    with open(report) as f:
        ref = json.load(f)
    results = []
    for t in range(trials):
        root = os.path.join(out, f"kill-{what}-{t}")
        shutil.rmtree(root, ignore_errors=True)
        job = write_job(os.path.join(root, "job.yaml"), job_dict(info, root, 8, 2))
        with heavy_lock(), ray_cluster(root, nodes=2) as cluster:
            t0 = time.perf_counter()
            client, job_id = submit_prepare(cluster, job)
            after = KILL_AFTER[t % len(KILL_AFTER)]  # the trials strike in different steps
            try:
                killed = kill_mid_stage_and_wait(cluster, client, job_id, what, os.path.join(root, "work", "*"),
                                                 after=after and os.path.join(root, "work", "*", "_done", after, "*.json"))
            except RuntimeError as e:  # no task of that step was found running: the trial did not strike
                killed = {"status": "NOT STRUCK", "victim": str(e).splitlines()[0], "step": after}
            wall = time.perf_counter() - t0
        rep_files = glob.glob(os.path.join(root, "work", "*", "report.json"))
        rep = json.load(open(rep_files[0])) if rep_files else {}
        ok = (killed["status"] == "SUCCEEDED" and rep.get("manifest_sha256") == ref["manifest_sha256"]
              and rep.get("accounting") == ref["accounting"])
        logs = killed.pop("logs", "")
        results.append({"trial": t, "ok": ok, "wall_s": wall, **killed, "retries": rep.get("retries")})
        if not ok and killed["status"] != "NOT STRUCK":
            print(logs[-2000:])
        print(f"trial {t}: {what} killed in {killed.get('step')} ({killed.get('victim')}), job {killed['status']}, "
              f"{'same hash' if rep.get('manifest_sha256') == ref['manifest_sha256'] else 'hash differs or missing'}, "
              f"retries {rep.get('retries')}, {wall:.0f} s", flush=True)
        shutil.rmtree(root, ignore_errors=True)
    struck = [r for r in results if r["status"] != "NOT STRUCK"]
    print(f"{sum(r['ok'] for r in struck)}/{len(struck)} trials that struck finished without a rerun with the reference "
          f"hash and accounting ({trials - len(struck)} did not strike)")
    return results


def extract_rate(out: str, scale: int) -> dict:
    """Extract + language ID of the demo corpus's WARC file (HTML pages through resiliparse) in this
    process, one core: what a CommonCrawl WARC costs per byte (docs/scaling.md)."""
    import gzip

    from helpers import extract_files

    demo = os.path.join(out, f"demo-{scale}")
    if not os.path.isdir(os.path.join(demo, "corpus")):
        subprocess.run([*GRISTMILL, "demo-corpus", demo, "--scale", str(scale)], check=True,
                       stdout=subprocess.DEVNULL)
    (warc,) = glob.glob(os.path.join(demo, "corpus", "*.warc.gz"))
    with gzip.open(warc) as f:
        raw = len(f.read())
    work = os.path.join(out, "extract-rate")
    shutil.rmtree(work, ignore_errors=True)
    with heavy_lock():
        t0, c0 = time.perf_counter(), time.process_time()
        stats, docs, _ = extract_files(work, [(warc, "warc")], language=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    res = {"warc_gz_bytes": os.path.getsize(warc), "warc_bytes": raw, "records": stats["extract"]["records"],
           "documents": len(docs), "text_bytes": sum(len(d["text"].encode()) for d in docs), "wall_s": wall, "cpu_s": cpu}
    res["html"] = html_rate()
    print(f"WARC extract + language, one core: {res['records']:,} records, {raw / 1e6:.1f} MB of WARC "
          f"({res['warc_gz_bytes'] / 1e6:.1f} MB gzipped) -> {res['text_bytes'] / 1e6:.1f} MB of text in {cpu:.2f} CPU-s: "
          f"{raw / 1e6 / cpu:.1f} MB of WARC/s, {res['warc_gz_bytes'] / 1e6 / cpu:.1f} MB gz/s, {res['records'] / cpu:,.0f} records/s")
    h = res["html"]
    print(f"HTML main-content extraction, one core: {h['pages']} pydoc pages of {h['page_kb']:.0f} KB: "
          f"{h['mb_per_cpu_s']:.1f} MB of HTML/s, {h['ms_per_page']:.1f} ms a page")
    return res


def html_rate(repeat: int = 3) -> dict:
    """resiliparse main-content extraction (pipeline.html) on full-size pages: pydoc's HTML of 17
    standard-library modules (~100 KB each, markup-heavy like web pages); the demo's WARC pages are
    ~2 KB, too small to give a per-byte rate for a crawl."""
    import importlib
    import pydoc

    from gristmill.pipeline.html import html_to_text

    mods = ("argparse asyncio collections email json logging os pathlib re socket subprocess threading typing "
            "unittest urllib.request xml.dom.minidom zipfile").split()
    pages = [pydoc.html.page(m, pydoc.html.document(importlib.import_module(m))).encode() for m in mods]
    with heavy_lock():
        c0 = time.process_time()
        for _ in range(repeat):
            for p in pages:
                html_to_text(p, "utf-8")
        cpu = time.process_time() - c0
    n = sum(map(len, pages))
    return {"pages": len(pages), "page_kb": n / len(pages) / 1e3, "mb_per_cpu_s": repeat * n / 1e6 / cpu,
            "ms_per_page": cpu / (repeat * len(pages)) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[8, 250, 1000, 4000])
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--docs", type=int, default=8000)
    ap.add_argument("--paragraphs", type=int, default=13)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--runner", choices=["auto", "local", "ray"], default="auto")
    ap.add_argument("--budget-s", type=float, default=0, help="stop a run after this many seconds and project (0: never)")
    ap.add_argument("--kill-trials", type=int, default=0)
    ap.add_argument("--kill", choices=["worker", "node"], default="worker")
    ap.add_argument("--extract-rate", type=int, metavar="SCALE", help="only measure WARC extract on the demo corpus at SCALE")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out", "partitions"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--tables", nargs="+", metavar="JSON", help="print the tables of earlier runs' --json files, together")
    a = ap.parse_args()
    # The manifest records the code version (the git commit): pinned for the whole benchmark, so a
    # commit made while it runs cannot make a run differ from its reference.
    os.environ.setdefault("GRISTMILL_CODE_VERSION", f"bench_partitions at {_commit()}")
    if a.tables:
        loaded = [json.load(open(p)) for p in a.tables]
        print_scaling(loaded[0]["corpus"], [r for d in loaded for r in d["results"]], a.num_cpus)
        return
    for p in [] if a.kill_trials else a.partitions:
        if a.files % p:
            ap.error(f"--partitions {p} must divide --files {a.files}")
    os.makedirs(a.out, exist_ok=True)
    if a.extract_rate:
        extract_rate(os.path.abspath(a.out), a.extract_rate)
        return
    info = corpus(os.path.abspath(a.out), a.files, a.docs, a.paragraphs)
    if a.kill_trials:
        results = kill_trials(info, os.path.abspath(a.out), a.kill_trials, a.kill)
    else:
        results = []
        for p in a.partitions:
            results.append(run_one(info, os.path.abspath(a.out), p, a.num_cpus, a.budget_s, a.runner))
            print(f"P={p}: {results[-1]['wall_s']:.1f} s{' (stopped)' if results[-1]['stopped'] else ''}", flush=True)
        print_scaling(info, results, a.num_cpus)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"corpus": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
