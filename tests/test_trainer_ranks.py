"""Two ranks under torchrun on gloo (CPU): hangs and kills are restarted by torchrun and finish
bitwise equal to an uninterrupted run; every rank's timings reach the train records without a
collective or host read on the steps between records (trainer/watchdog.py, rendezvous.py,
rank_stats.py; tests/fault_launcher.py injects the faults)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from gristmill.manifests.synthetic import build_synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "configs", "train-tiny.yaml")
LAUNCHER = os.path.join(ROOT, "tests", "fault_launcher.py")
STEPS = 20
WATCHDOG_EXIT = 75  # trainer/watchdog.py EXIT_CODE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return build_synthetic(str(tmp_path_factory.mktemp("count")), dataset="count", vocab_size=64,
                           shard_rows=(48,) * 4, val_rows=(16,), tokens="counting").url


def torchrun(data: str, run_dir: str, *sets: str, faults=(), launcher_args=(), restarts: int = 1,
             timeout_s: float = 240, kill_pid_file: str | None = None) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 --max-restarts N`` (its default launch: static rendezvous) of
    tests/fault_launcher.py on the tiny job. With ``kill_pid_file``: SIGKILL the pid the file
    names as soon as it appears (a rank killed mid-run)."""
    os.makedirs(run_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--max_restarts={restarts}",
           f"--master_port={free_port()}", LAUNCHER, f"--marker-dir={run_dir}", *[f"--fault={f}" for f in faults],
           *launcher_args, JOB]
    for s in (f"data.manifest={data}", f"run.dir={run_dir}", f"data.cache_dir={run_dir}-cache", f"run.steps={STEPS}",
              "checkpoint.every=5", "eval.every=0", "run.tensorboard=false", *sets):
        cmd += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    with open(os.path.join(run_dir, "torchrun.log"), "w") as log:
        p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        try:
            while p.poll() is None and time.monotonic() < deadline:
                if kill_pid_file and os.path.exists(kill_pid_file) and os.path.getsize(kill_pid_file):
                    os.kill(int(open(kill_pid_file).read()), signal.SIGKILL)
                    kill_pid_file = None
                time.sleep(0.05)
        finally:
            if p.poll() is None:  # a hang: end what we started, by its process group
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return subprocess.CompletedProcess(cmd, p.returncode, open(os.path.join(run_dir, "torchrun.log")).read(), "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def records(run_dir: str, kind: str = "train") -> dict[int, dict]:
    """The last record of each step (a restarted run appends; later lines win)."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for r in map(json.loads, f):
            if r["kind"] == kind:
                out[r["step"]] = r
    return out


def final_loss_hex(run_dir: str) -> str:
    return float.hex(records(run_dir)[STEPS]["loss"])


def check(proc) -> None:
    assert proc.returncode == 0, f"torchrun exit {proc.returncode}:\n{proc.stdout[-6000:]}"


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("reference"))
    check(torchrun(data, run_dir))
    return final_loss_hex(run_dir)


def test_a_rank_hung_before_a_collective_is_ended_by_the_watchdog_and_the_job_restarts_bitwise(data, reference,
                                                                                                 tmp_path):
    run_dir = str(tmp_path / "hang")
    proc = torchrun(data, run_dir, "run.hang_timeout_s=15", faults=["hang@8"])
    check(proc)
    out = proc.stdout
    host = socket.gethostname()
    # rank 1 slept in its loss hook; rank 0 blocked inside step 8's collectives: both are named
    assert f"gristmill watchdog: rank 1 on host {host}" in out and "training step (step 8)" in out
    assert f"gristmill watchdog: rank 0 on host {host}" in out  # blocked inside the collective
    dump = out.split(f"gristmill watchdog: rank 1 on host {host}")[1]
    assert "Thread 0x" in dump and "fault_launcher.py" in dump  # every thread's stack, the hung hook's too
    assert f"failed (exitcode: {WATCHDOG_EXIT})" in out  # torchrun saw the watchdog's exit, then restarted
    resumed = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert sorted(r["step"] for r in resumed if r["kind"] == "train").count(6) == 2  # steps 6.. ran again
    assert final_loss_hex(run_dir) == reference


def test_a_rank_killed_mid_run_is_restarted_and_the_job_finishes_bitwise(data, reference, tmp_path):
    run_dir = str(tmp_path / "kill")
    proc = torchrun(data, run_dir, faults=["pid@8"], kill_pid_file=str(tmp_path / "kill" / "pid-rank1"))
    check(proc)
    assert "failed (exitcode: -9)" in proc.stdout  # torchrun saw the SIGKILL and restarted the group
    assert final_loss_hex(run_dir) == reference


def test_a_slow_rank_shows_in_its_input_wait_and_is_named_a_straggler(data, tmp_path):
    run_dir = str(tmp_path / "slow")
    proc = torchrun(data, run_dir, "run.log_every=2", "run.straggler_windows=2", "checkpoint.enabled=false",
                    faults=["slow_data@150"], restarts=0)
    check(proc)
    recs = [r for _, r in sorted(records(run_dir).items())][1:]  # the first window holds the start-up
    for r in recs:
        assert r["window_steps"] == 2 and len(r["rank_input_wait_s"]) == len(r["rank_step_s"]) == 2
        assert r["rank_input_wait_s"][1] >= 0.14 > r["rank_input_wait_s"][0]  # rank 1's own sleep
        assert r["rank_collective_wait_s"][0] > 0.1  # rank 0 waits for it in the first collective
    stragglers = list(records(run_dir, "straggler").values())
    assert stragglers and {s["rank"] for s in stragglers} == {1}
    assert stragglers[0]["host"] == socket.gethostname() and stragglers[0]["windows"] == 2
    assert f"straggler: rank 1 on host {socket.gethostname()}" in proc.stdout


def test_steps_without_a_record_add_no_collective_and_no_host_read(data, tmp_path):
    run_dir = str(tmp_path / "count")
    check(torchrun(data, run_dir, "run.log_every=4", "checkpoint.enabled=false", restarts=0,
                   launcher_args=["--count-collectives"]))
    for rank in (0, 1):
        with open(os.path.join(run_dir, f"counts-rank{rank}.jsonl")) as f:
            counts = {r["step"]: r["counts"] for r in map(json.loads, f)}
        assert sorted(counts) == list(range(1, STEPS))  # the last step's counts end with the process
        for step, c in counts.items():
            gathers = c.get("all_gather", 0)
            if step % 4:  # no record: the training's own collectives only, nothing read on the host
                assert gathers == 0 and c.get("item", 0) == 0 and c.get("tolist", 0) == 0, (step, c)
                assert c.get("all_reduce", 0) == 1, (step, c)  # the loss (logged at the record)
            else:  # a record: one gather of every rank's window, then the reads
                assert gathers == 1, (step, c)


def test_a_bad_step_read_at_the_next_record_is_skipped_exactly_as_one_read_at_once(data, tmp_path):
    """The skip is decided on the device (fused AdamW's found_inf): a run that reads its losses
    only every 4 steps skips step 2 exactly as one that reads every step, records it, and counts it."""
    runs = {}
    for every in (1, 4):
        run_dir = str(tmp_path / f"every-{every}")
        cmd = [sys.executable, LAUNCHER, "--fault=nan_loss@2", JOB]
        for s in (f"data.manifest={data}", f"run.dir={run_dir}", f"data.cache_dir={run_dir}-cache", "run.steps=8",
                  f"run.log_every={every}", "checkpoint.every=3", "checkpoint.keep=5", "eval.every=0", "run.tensorboard=false"):
            cmd += ["--set", s]
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                              text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[every] = records(run_dir)
        assert "step 2: non-finite loss nan or grad norm nan: optimizer step skipped" in proc.stderr
    assert runs[4][2]["skipped"] is True and runs[4][4]["skipped"] is False and runs[4][8]["skipped_total"] == 1
    assert sorted(runs[4]) == [2, 4, 8]  # the records, and the skipped step's own
    for step in (4, 8):
        assert float.hex(runs[4][step]["loss"]) == float.hex(runs[1][step]["loss"])
    with open(os.path.join(str(tmp_path / "every-4"), "checkpoints", "step-3", "meta.json")) as f:
        assert json.load(f)["bad_steps"] == {"skipped_total": 1, "consecutive": 0}  # read before the save
