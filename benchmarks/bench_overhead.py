"""Orchestration overhead of `prepare` (issue 14, target 3): CPU of the whole run over the CPU of its tasks.

    .venv/bin/python benchmarks/bench_overhead.py [--scale 30] [--num-cpus 2] [--out bench-out/overhead]

The job is examples/demo-job-full.yaml pointed at `gristmill demo-corpus --scale N`. The run is one
fresh process: it starts the embedded Ray, runs `prepare`, and, before Ray shuts down, sums the
CPU time (user + system, from /proc) of itself and every process below it: the driver, Ray's GCS,
raylet, dashboard and agents, and the worker processes, which Ray keeps alive for the run. The
denominator is the work itself: the CPU seconds every task recorded in its completion marker
(`_cpu_seconds`: the task's process CPU time, all its threads), i.e. what the stages cost when
their tasks run with nothing around them. The ratio is what orchestration (Ray, scheduling,
barriers, the driver) adds. Worker processes Ray retired mid-run are not counted (an
under-estimate of the numerator of at most their idle time).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root_pid: int) -> float:
    """utime + stime of ``root_pid`` and all its live descendants."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.split("/")[2]), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        cpu[pid] = (int(fields[11]) + int(fields[12])) / TICK
    total, todo = 0.0, [root_pid]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def _job(scale_dir: str, out: str) -> str:
    with open(os.path.join(ROOT, "examples", "demo-job-full.yaml")) as f:
        job = yaml.safe_load(f)
    text = json.dumps(job).replace("../demo-out", scale_dir)
    job = json.loads(text)
    job["work_dir"], job["output"]["store"] = os.path.join(out, "work"), os.path.join(out, "store")
    path = os.path.join(out, "job.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(job, f)
    return path


def _child(job_path: str, num_cpus: int) -> None:
    """The measured process: Ray up, prepare, measure, Ray down."""
    import ray

    from gristmill.pipeline.config import load_job
    from gristmill.pipeline.executor import prepare
    from gristmill.pipeline.workdir import WorkDir

    t0 = time.perf_counter()
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    result = prepare(load_job(job_path), quiet=True)
    wall = time.perf_counter() - t0
    total = tree_cpu_seconds(os.getpid())
    tasks = 0.0
    wd = WorkDir(result.run_dir)
    for step in os.listdir(os.path.join(result.run_dir, "_done")):  # task markers and batch markers
        tasks += sum(float(s.get("_cpu_seconds", 0.0)) for s in wd.finished(step).values())
    print(json.dumps({"wall_s": wall, "tree_cpu_s": total, "task_cpu_s": tasks, "ratio": total / tasks,
                      "manifest": result.manifest_sha256}))
    ray.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=int, default=30)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out", "overhead"))
    ap.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        _child(args._child[0], int(args._child[1]))
        return 0
    out = os.path.abspath(args.out)
    corpus = os.path.join(out, f"corpus-{args.scale}")
    if not os.path.exists(os.path.join(corpus, "corpus")):
        subprocess.run([sys.executable, "-m", "gristmill", "demo-corpus", corpus, "--scale", str(args.scale)], check=True)
    print(f"scale {args.scale}, {args.num_cpus} CPUs")
    for run in range(args.runs):
        run_dir = os.path.join(out, f"run-{args.scale}-{run}")
        subprocess.run(["rm", "-rf", run_dir], check=True)
        os.makedirs(run_dir)
        job = _job(corpus, run_dir)
        done = subprocess.run([sys.executable, __file__, "--_child", job, str(args.num_cpus)], capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"run {run}: wall {r['wall_s']:.1f} s  CPU of the whole tree {r['tree_cpu_s']:.1f} s  "
              f"CPU of the tasks {r['task_cpu_s']:.1f} s  overhead ratio {r['ratio']:.3f}  manifest {r['manifest'][:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
