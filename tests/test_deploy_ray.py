"""`gristmill prepare` on a real two-node Ray cluster on this machine, submitted through the Ray
Jobs API, as an operator does with `ray job submit` (docs/deploy.md).

The cluster is two `ray start --block` processes (a head and a worker node, one CPU each) with
their own temp dir and ports, so they never meet the test session's Ray. They are stopped by
process id, never with `ray stop`: that kills every Ray on the machine, other people's included.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

BIN = os.path.dirname(sys.executable)  # the venv's bin: `ray` and `gristmill` live next to python
START_TIMEOUT_S = 60
JOB_TIMEOUT_S = 150

WORDS = ("the river runs past the old mill where farmers bring their grain every autumn and the miller "
         "weighs each sack before the stones turn it into flour for the bakers of the town").split()


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
            raise RuntimeError(f"only {len(alive)} of {want} Ray nodes joined within {START_TIMEOUT_S} s")
        time.sleep(0.5)


@contextlib.contextmanager
def ray_cluster(workdir: str, *, nodes: int = 2):
    """A Ray head plus ``nodes - 1`` worker nodes, one CPU each; yields (dashboard URL, node ids)."""
    # Unix socket paths live under the temp dir and must stay short (<= 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="gm-ray-", dir="/tmp")
    gcs, dash, client = free_ports(3)
    common = ["--block", "--num-cpus=1", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    head = [f"{BIN}/ray", "start", "--head", f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}", f"--ray-client-server-port={client}", *common, *node_ports_args()]
    worker = [f"{BIN}/ray", "start", f"--address=127.0.0.1:{gcs}", *common]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    procs, logs = [], []
    try:
        for i, cmd in enumerate([head] + [worker + node_ports_args() for _ in range(nodes - 1)]):
            logs.append(os.path.join(workdir, f"ray-node-{i}.log"))
            with open(logs[-1], "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            if i == 0:  # workers need the GCS up
                wait_for_nodes(f"http://127.0.0.1:{dash}", 1, procs, logs)
        url = f"http://127.0.0.1:{dash}"
        yield url, wait_for_nodes(url, nodes, procs, logs)
    finally:
        stop_nodes(procs)
        shutil.rmtree(temp_dir, ignore_errors=True)


def write_corpus(root: str, files: int = 4, docs_per_file: int = 12) -> str:
    """Small English JSONL files; file f repeats a document of file f-1, so exact dedup removes some."""
    os.makedirs(root, exist_ok=True)
    for f in range(files):
        with open(os.path.join(root, f"part-{f}.jsonl"), "w") as out:
            for d in range(docs_per_file):
                k = (f * docs_per_file + d) if d else max(f - 1, 0) * docs_per_file + 1
                words = [WORDS[(k * 7 + i * (k % 5 + 1)) % len(WORDS)] for i in range(40 + k % 30)]
                out.write(json.dumps({"text": f"Story {k}. " + " ".join(words) + "."}) + "\n")
    return root


def write_job(path: str, corpus: str, out: str) -> str:
    job = {
        "inputs": [{"path": os.path.join(corpus, "*.jsonl")}],
        "output": {"store": os.path.join(out, "store"), "dataset": "tiny"},
        "work_dir": os.path.join(out, "work"),
        "language": {"allowed": ["en"], "threshold": 0.3},
        "split": {"validation_fraction": 0.1},
        "tokenizer": {"vocab_size": 300, "sample_bytes": 100_000},
        "pack": {"seq_len": 16, "shard_bytes": 4096},
    }
    with open(path, "w") as f:
        json.dump(job, f)  # JSON is YAML
    return path


def wait_for_job(client, job_id: str) -> str:
    from ray.job_submission import JobStatus

    deadline = time.time() + JOB_TIMEOUT_S
    while (status := client.get_job_status(job_id)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        if time.time() > deadline:
            client.stop_job(job_id)
            break
        time.sleep(1)
    return status


def pipeline_task_nodes(dashboard: str, job_hex: str) -> set[str]:
    """Node ids of the finished Ray Data tasks of the job (task events reach the GCS within ~1 s)."""
    from ray.util.state import list_tasks

    nodes: set[str] = set()
    for _ in range(20):
        tasks = list_tasks(address=dashboard, filters=[("job_id", "=", job_hex), ("state", "=", "FINISHED")],
                           detail=True, limit=10_000, raise_on_missing_output=False)
        nodes = {t.node_id for t in tasks if t.type == "NORMAL_TASK" and t.node_id}
        if len(nodes) >= 2:
            break
        time.sleep(0.5)
    return nodes


@pytest.mark.slow
def test_prepare_on_two_node_ray_cluster_matches_single_process(tmp_path, ray_session):
    from ray.job_submission import JobStatus, JobSubmissionClient

    from gristmill.manifests import ManifestStore, verify_published
    from gristmill.pipeline.config import load_job
    from gristmill.pipeline.executor import prepare

    corpus = write_corpus(str(tmp_path / "corpus"))
    cluster_job = write_job(str(tmp_path / "cluster-job.yaml"), corpus, str(tmp_path / "cluster"))
    local_job = write_job(str(tmp_path / "local-job.yaml"), corpus, str(tmp_path / "local"))

    with ray_cluster(str(tmp_path), nodes=2) as (dashboard, node_ids):
        assert len(set(node_ids)) == 2
        client = JobSubmissionClient(dashboard)
        # What `ray job submit --address URL -- gristmill prepare JOB.yaml` sends.
        job_id = client.submit_job(entrypoint=shlex.join([f"{BIN}/gristmill", "prepare", cluster_job]),
                                   runtime_env={"env_vars": {"PATH": f"{BIN}:{os.environ.get('PATH', '')}"}})
        status = wait_for_job(client, job_id)
        logs = client.get_job_logs(job_id)
        assert status == JobStatus.SUCCEEDED, f"job {job_id} ended {status}:\n{logs[-4000:]}"
        job_hex = client.get_job_info(job_id).job_id
        ran_on = pipeline_task_nodes(dashboard, job_hex)
    assert ran_on == set(node_ids), f"pipeline tasks ran on {sorted(ran_on)}, cluster nodes are {sorted(node_ids)}"

    distributed = ManifestStore(str(tmp_path / "cluster" / "store")).load("tiny")
    assert verify_published(distributed) == []
    assert distributed.manifest.stats  # a real run: documents went through every stage
    # The reference: the same job in this process, on the test session's local Ray.
    single = prepare(load_job(local_job), quiet=True)
    assert distributed.manifest.sha256 == single.manifest_sha256, "the cluster run published different bytes"
