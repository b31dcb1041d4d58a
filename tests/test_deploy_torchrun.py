"""Multi-node `gristmill train` as deploy/slurm/train.sbatch and deploy/k8s/train-job.yaml run
it: one torchrun per "node", joined by c10d rendezvous, here two torchruns on 127.0.0.1.

The run checkpoints, loses its newest checkpoint (as a crash right after step 3 would), and the
same command resumes from the one before: the resumed steps must repeat the lost ones exactly.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_JOB = os.path.join(REPO, "configs", "train-tiny.yaml")
NODES = 2
RUN_TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_nodes(overrides: list[str], logs_dir: str, tag: str) -> None:
    """Start one `torchrun --nnodes 2` per node, as the sbatch script's srun does; wait for both."""
    port, rdzv_id = free_port(), f"gristmill-test-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", "--nproc_per_node=1",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={rdzv_id}",
           "--local_addr=127.0.0.1", "--max_restarts=0",
           "-m", "gristmill.cli", "train", TRAIN_JOB, *[a for o in overrides for a in ("--set", o)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs, logs = [], []
    try:
        for node in range(NODES):
            logs.append(os.path.join(logs_dir, f"{tag}-node{node}.log"))
            with open(logs[-1], "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                              start_new_session=True))
        codes = [p.wait(timeout=RUN_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:  # only on a timeout or an error above: end what we started, by process group
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    if any(codes):
        tails = "\n".join(f"--- {log} ---\n{open(log, errors='replace').read()[-3000:]}" for log in logs)
        raise AssertionError(f"torchrun exit codes {codes}:\n{tails}")


def train_losses(run_dir: str) -> list[tuple[int, float]]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [(r["step"], r["loss"]) for r in map(json.loads, f) if r.get("kind") == "train"]


def read_meta(ckpt: str) -> dict:
    with open(os.path.join(ckpt, "meta.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_two_node_torchrun_checkpoints_and_resumes(tmp_path):
    from helpers import build_dataset

    data = build_dataset(str(tmp_path / "data"))
    run_dir = str(tmp_path / "run")
    steps, batch = 4, 4
    overrides = [f"run.dir={run_dir}", f"run.steps={steps}", "run.tensorboard=false", f"data.manifest={data.url}",
                 f"data.global_batch={batch}", "data.prefetch=1", "checkpoint.every=2", "checkpoint.keep=3",
                 "eval.every=0", "optimizer.warmup_steps=1"]

    torchrun_nodes(overrides, str(tmp_path), "first")
    ckpts = os.path.join(run_dir, "checkpoints")
    assert sorted(os.listdir(ckpts)) == ["step-2", "step-4"]
    first = read_meta(os.path.join(ckpts, "step-4"))
    assert first["world_size"] == NODES  # one rank per node: both nodes trained
    assert first["step"] == steps and first["loader"]["next_index"] == steps * batch
    assert first["data"]["manifest_sha256"] == data.manifest.sha256
    before = dict(train_losses(run_dir))
    assert sorted(before) == list(range(1, steps + 1))

    # A crash after step 3: step-4 never committed. The same command resumes from step-2.
    shutil.rmtree(os.path.join(ckpts, "step-4"))
    torchrun_nodes(overrides, str(tmp_path), "resume")
    resumed = read_meta(os.path.join(ckpts, "step-4"))
    assert resumed["resumed_from"] == os.path.join(ckpts, "step-2")
    assert resumed["world_size"] == NODES and resumed["loader"] == first["loader"]
    again = train_losses(run_dir)[steps:]  # metrics.jsonl is appended to: the resumed run's records
    assert [s for s, _ in again] == [3, 4]
    for step, loss in again:
        assert loss == pytest.approx(before[step], rel=1e-6, abs=1e-7), f"step {step} after resume"
