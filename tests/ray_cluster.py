"""A local multi-node Ray cluster on this machine, for tests and benchmarks (tests/test_deploy_ray.py,
benchmarks/bench_partitions.py), and the faults a real cluster meets: a worker process or a whole
node dying mid-stage.

The cluster is ``ray start --block`` processes (a head and worker nodes, one CPU each) with their own
temp dir and ports, so they never meet the test session's Ray. They are stopped by process id, never
with `ray stop`: that kills every Ray on the machine, other people's included. Each node is started
in a new session, so its session id names exactly the processes it spawned (its raylet, its
workers): that is how a fault picks its victim on the right node.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from gristmill.pipeline.workdir import WorkDir

BIN = os.path.dirname(sys.executable)  # the venv's bin
# This interpreter, not the bin/ scripts: a script's shebang may name another venv's python (a
# copied venv), and Ray starts a node's workers with the python that ran `ray start`.
GRISTMILL = (sys.executable, "-m", "gristmill")
RAY = (sys.executable, "-m", "ray.scripts.scripts")
START_TIMEOUT_S = 120  # a busy 2-core machine starts a head in 5-60 s
JOB_TIMEOUT_S = 240
# The process title of a Ray worker while it runs the pipeline's tasks ("ray::" + the remote
# function's name: pipeline.runner.run_batch, a batch of items; run_one / _run_one before it); an
# idle worker reads "ray::IDLE", the Jobs API's driver host "ray::JobSupervisor".
TASK_TITLES = ("ray::run_batch", "ray::run_one", "ray::_run_one")


@dataclass
class Cluster:
    dashboard: str  # http://127.0.0.1:PORT: the Jobs API and the state API
    gcs: str  # 127.0.0.1:PORT: what `ray start --address` and `ray.init(address=...)` take
    node_ids: list[str]
    procs: list[subprocess.Popen]  # the `ray start --block` of each node, the head first
    logs: list[str]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago (held open together so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_ports_args() -> list[str]:
    """Every port a Ray node opens, explicitly free: two nodes on one host must not share any."""
    names = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-grpc-port",
             "--dashboard-agent-listen-port", "--metrics-export-port", "--runtime-env-agent-port")
    return [f"{name}={port}" for name, port in zip(names, free_ports(len(names)))]


def session_members(sids: set[int]) -> list[int]:
    """Pids of the live processes whose session id is one of ``sids`` (our `ray start` sessions)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sids and fields[0] != "Z":  # fields[3] is the session id
            out.append(int(entry))
    return out


def stop_nodes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each `ray start --block` (it stops its node's processes), then SIGKILL leftovers.

    Each was started in a new session, so the session id names exactly the processes it spawned.
    """
    for p in reversed(procs):  # worker nodes first, the head last
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    sids = {p.pid for p in procs}
    deadline = time.time() + 10
    while (left := session_members(sids)) and time.time() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def wait_for_nodes(dashboard: str, want: int, procs: list[subprocess.Popen], logs: list[str]) -> list[str]:
    """Node ids of the alive nodes, once ``want`` of them have joined."""
    from ray.util.state import list_nodes

    deadline = time.time() + START_TIMEOUT_S
    while True:
        for p, log in zip(procs, logs):
            if p.poll() is not None:
                raise RuntimeError(f"`ray start` exited with {p.returncode}:\n{open(log).read()[-3000:]}")
        try:
            alive = [n.node_id for n in list_nodes(address=dashboard, filters=[("state", "=", "ALIVE")])]
        except Exception:  # the dashboard is not up yet
            alive = []
        if len(alive) >= want:
            return alive
        if time.time() > deadline:
            tails = "\n".join(f"--- {log}:\n{open(log, errors='replace').read()[-1500:]}" for log in logs)
            raise RuntimeError(f"only {len(alive)} of {want} Ray nodes joined within {START_TIMEOUT_S} s\n{tails}")
        time.sleep(0.5)


@contextlib.contextmanager
def ray_cluster(workdir: str, *, nodes: int = 2):
    """A Ray head plus ``nodes - 1`` worker nodes, one CPU each; yields a ``Cluster``."""
    # Unix socket paths live under the temp dir and must stay short (<= 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="gm-ray-", dir="/tmp")
    gcs, dash, client = free_ports(3)
    common = ["--block", "--num-cpus=1", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    head = [*RAY, "start", "--head", f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}", f"--ray-client-server-port={client}", *common, *node_ports_args()]
    worker = [*RAY, "start", f"--address=127.0.0.1:{gcs}", *common]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    # A private cluster on 127.0.0.1: no token auth. Ray 2.60 turns it on for a head once
    # ~/.ray/auth_token exists (any earlier `ray.init` may write it), and then this process's
    # state and job clients, which do not send the token, are refused.
    env["RAY_AUTH_MODE"] = "disabled"
    procs, logs = [], []
    try:
        for i, cmd in enumerate([head] + [worker + node_ports_args() for _ in range(nodes - 1)]):
            logs.append(os.path.join(workdir, f"ray-node-{i}.log"))
            with open(logs[-1], "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            if i == 0:  # workers need the GCS up
                wait_for_nodes(f"http://127.0.0.1:{dash}", 1, procs, logs)
        url = f"http://127.0.0.1:{dash}"
        yield Cluster(url, f"127.0.0.1:{gcs}", wait_for_nodes(url, nodes, procs, logs), procs, logs)
    finally:
        stop_nodes(procs)
        shutil.rmtree(temp_dir, ignore_errors=True)


def wait_for_job(client, job_id: str, timeout_s: float = JOB_TIMEOUT_S) -> str:
    from ray.job_submission import JobStatus

    deadline = time.time() + timeout_s
    while (status := client.get_job_status(job_id)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        if time.time() > deadline:
            client.stop_job(job_id)
            break
        time.sleep(1)
    return status


def submit_prepare(cluster: Cluster, job_path: str):
    """What `ray job submit --address URL -- gristmill prepare JOB.yaml` sends; (client, job id)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard)
    job_id = client.submit_job(entrypoint=shlex.join([*GRISTMILL, "prepare", job_path]),
                               runtime_env={"env_vars": {"PATH": f"{BIN}:{os.environ.get('PATH', '')}"}})
    return client, job_id


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def task_workers(node: subprocess.Popen) -> list[int]:
    """Pids of the node's worker processes that are running a pipeline task right now."""
    return [pid for pid in session_members({node.pid}) if _cmdline(pid).startswith(TASK_TITLES)]


def raylet(node: subprocess.Popen) -> int:
    (pid,) = [p for p in session_members({node.pid}) if "/raylet" in _cmdline(p).split(" ")[0]]
    return pid


def uncommitted_batches(work: str) -> list[tuple[WorkDir, str, str, int]]:
    """(run dir, step, first task, worker pid) of each batch a worker has claimed (its attempt
    file, which holds ``<host> <pid>``: pipeline.runner.record_attempt) and not yet committed, in
    the run dirs matching the glob ``work``."""
    import glob

    out = []
    for run in sorted(glob.glob(work)):
        wd = WorkDir(run)
        for path in sorted(glob.glob(os.path.join(wd.logs("*"), "*.attempt-*"))):
            if (attempt := WorkDir.attempt_of(os.path.basename(path))) is None:
                continue  # an attempt file being created (its temp)
            step, first = os.path.basename(os.path.dirname(path)), attempt[0]
            if committed(wd, step, first):
                continue
            try:
                with open(path) as f:
                    pid = int(f.read().split()[1])
            except (OSError, IndexError, ValueError):  # being written this instant
                continue
            out.append((wd, step, first, pid))
    return out


def committed(wd: WorkDir, step: str, first: str) -> bool:
    """Whether the batch that starts with task ``first`` has its marker (a batch's, or its one task's)."""
    return wd.exists(wd.batch_marker(step, first)) or wd.exists(wd.marker(step, first))


def kill_mid_stage(cluster: Cluster, what: str, work: str, *, after: str | None = None, timeout_s: float = 120) -> dict:
    """Once a file matching the glob ``after`` exists (a step under way), SIGKILL a worker (``worker``)
    or the second node's raylet (``node``) while the worker (on the second node for ``node``) holds
    a batch it has claimed and not committed, in the run dirs matching the glob ``work``: so the
    batch is lost and Ray must run it again, which leaves ``attempt-2``. Returns what was killed."""
    import glob

    nodes = range(len(cluster.procs)) if what == "worker" else [1]
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if after is None or glob.glob(after):
            workers = {pid: i for i in nodes for pid in task_workers(cluster.procs[i])}
            for wd, step, first, pid in uncommitted_batches(work):
                if pid not in workers:
                    continue  # an earlier attempt's worker, or one on another node
                i = workers[pid]
                victim = pid if what == "worker" else raylet(cluster.procs[i])
                title = _cmdline(victim)[:200]
                if what == "node":
                    # The node is lost with the batch in flight: its worker dies with its raylet, as on
                    # a dead machine. (A worker outlives its raylet for a moment, and one that finished
                    # its batch then delivered the result straight to the driver: no retry, and CI once
                    # failed so. A worker stopped instead of killed hangs the job: the driver waits for
                    # its reply.) One that had just committed may have delivered it: "committed" says so.
                    os.kill(pid, signal.SIGKILL)
                os.kill(victim, signal.SIGKILL)
                # A worker killed the moment after it committed may have delivered its result: strike
                # another. (A node's raylet is struck once.)
                done = committed(wd, step, first)
                if what == "node" or not done:
                    return {"what": what, "pid": victim, "node": i, "victim": title, "task_pid": pid,
                            "batch": f"{step}/{first}", "committed": done}
                break
        time.sleep(0.005)
    raise RuntimeError(f"no pipeline task ran on {'the second node' if what == 'node' else 'any node'} "
                       f"within {timeout_s} s{f' after {after} appeared' if after else ''}")


def kill_mid_stage_and_wait(cluster: Cluster, client, job_id: str, what: str, work: str, *,
                            after: str | None = None) -> dict:
    """``kill_mid_stage`` while the submitted job runs, then wait for the job; adds its end status and logs."""
    killed = kill_mid_stage(cluster, what, work, after=after)
    steps = [line.split("]")[0].lstrip("[") for line in client.get_job_logs(job_id).splitlines() if line.startswith("[")]
    status = wait_for_job(client, job_id)
    return {**killed, "step": steps[-1] if steps else None, "status": str(getattr(status, "value", status)),
            "logs": client.get_job_logs(job_id)}
