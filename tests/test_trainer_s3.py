"""Two-tier checkpoints to S3 end to end: real torchrun on gloo (2 ranks, the tiny model, 12 steps of
8 x 16 tokens) checkpointing to a local moto S3 server (tests/s3server.py), a kill -9 while a background
upload is stalled (tests/fault_launcher.py ``stall_upload``), and resumes from the store in a fresh run
dir (no local copy, as on a replacement node) and at world size 2 -> 1 from a local copy that is the
store's. Losses are compared bitwise (``float.hex``) where the world size is unchanged."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import kill_at_marker

from gristmill.manifests.synthetic import build_synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "configs", "train-tiny.yaml")
LAUNCHER = os.path.join(ROOT, "tests", "fault_launcher.py")
STEPS = 12

pytestmark = pytest.mark.slow


def run(manifest: str, run_dir: str, *sets: str, nproc: int = 2, faults=(), popen=False):
    """The tiny job through tests/fault_launcher.py (under torchrun when ``nproc`` > 1); checkpoints every 2 steps."""
    launcher = [sys.executable, LAUNCHER]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", LAUNCHER]
    args = [f"--fault={f}" for f in faults] + [JOB]
    for s in (f"data.manifest={manifest}", f"run.dir={run_dir}", f"data.cache_dir={run_dir}-cache",
              f"run.steps={STEPS}", "checkpoint.every=2", "eval.every=0", "run.tensorboard=false", *sets):
        args += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if popen:
        return subprocess.Popen(launcher + args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    proc = subprocess.run(launcher + args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-20000:]}"
    return proc.stderr


def losses(run_dir: str) -> dict[int, float]:
    """The last train record of each step (a resumed run appends)."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for r in map(json.loads, f):
            if r["kind"] == "train":
                out[r["step"]] = r["loss"]
    return out


def hexes(run_dir: str, steps) -> list[str]:
    got = losses(run_dir)
    return [float(got[s]).hex() for s in steps]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return build_synthetic(str(tmp_path_factory.mktemp("count")), dataset="count", vocab_size=64, shard_rows=(48, 48),
                           val_rows=(16,), tokens="counting").url


def test_s3_checkpoints_survive_kill_9_mid_upload_and_resume_anywhere(data, s3, tmp_path, capsys):
    from s3fs import S3FileSystem

    from gristmill.trainer.checkpoint_store import CheckpointStore

    ckpt, copy = f"{s3}/run/checkpoints", f"{s3}/copy/checkpoints"
    reference = str(tmp_path / "reference")  # uninterrupted, 2 ranks, checkpoints on local disk
    run(data, reference)

    # 1. Rank 1's step-8 upload stalls (rank 0's files and manifest are on the store); training goes on
    #    until the step-10 save waits for that upload; then every process is killed with SIGKILL.
    killed = str(tmp_path / "killed")
    proc = run(data, killed, f"checkpoint.dir={ckpt}", faults=["stall_upload@8"], popen=True)
    store = CheckpointStore(ckpt)
    # rank 0's own step-8 upload runs on beside rank 1's stall, and ends before its step-10 save: wait
    # for its manifest, the state this kill is about (killed at rank 1's marker alone, CI once caught it early)
    deadline = time.monotonic() + 120
    while not store.store.exists(store.step_url(8) + "/rank-0.json"):  # (the Store drops s3fs's listing cache)
        assert proc.poll() is None and time.monotonic() < deadline, "rank 0's step-8 manifest never reached the store"
        time.sleep(0.1)
    kill_at_marker(proc, os.path.join(killed, "HANGING-stall_upload-8"), "the step-8 upload")
    assert store.committed() == [4, 6]  # keep: 2; step-8 was cut short
    step8 = {os.path.basename(p) for p in S3FileSystem().ls(store.step_url(8).removeprefix("s3://"))}
    assert "rank-0.json" in step8 and "meta.json" not in step8 and "__1_0.distcp" not in step8
    S3FileSystem().copy(ckpt.removeprefix("s3://"), copy.removeprefix("s3://"), recursive=True)

    # 2. A fresh run dir (no local copy) resumes from the store at world size 2: the cut-short step-8 is
    #    never taken, and the run finishes with the uninterrupted run's losses, bit for bit.
    fresh = str(tmp_path / "fresh")
    out = run(data, fresh, f"checkpoint.dir={ckpt}")
    assert f"resumed from {fresh}/checkpoints/step-6 (step 6" in out and "downloading checkpoint" in out
    assert "removing the uncommitted checkpoint" in out and "step-8" in out
    assert hexes(fresh, range(1, STEPS + 1)) == hexes(reference, range(1, STEPS + 1))  # steps 1-6 came from the store
    assert store.committed() == [10, 12]
    meta12 = store.read_meta(12)
    assert meta12["resumed_from"] == store.step_url(6) and meta12["world_size"] == 2
    assert set(meta12["files"]) == {".metadata", "__0_0.distcp", "__1_0.distcp", "rank-0.json", "rank-1.json"}
    assert len(meta12["run_record"]["hostnames"]) == 2 and meta12["run_record"]["device"] == "cpu"

    # 3. The killed run's own dir, one process: its local step-6 copy is the store's (the copy's), so it is
    #    used without a download, and resharded 2 -> 1 it continues the same losses (to float reordering);
    #    checkpoints at the cadence from the failure rate.
    with open(os.path.join(killed, "metrics.jsonl")) as f:
        before = len(f.readlines())
    out = run(data, killed, f"checkpoint.dir={copy}", "checkpoint.every=auto", "checkpoint.auto_first_steps=2", nproc=1)
    assert "world size 2 -> 1" in out and "downloading checkpoint" not in out
    # every=auto: the first save 2 steps after the resume measures a save; Young/Daly for a 1-device job
    # (50,000 h MTBF) is then far beyond step 12, the end, which is always saved
    with open(os.path.join(killed, "metrics.jsonl")) as f:
        saves = [r for r in map(json.loads, f.readlines()[before:]) if r["kind"] == "checkpoint"]
    assert [r["step"] for r in saves] == [8, 12]
    assert saves[-1]["every"] == "auto" and saves[-1]["young_daly_every"] > STEPS and saves[-1]["waste_fixed"] is None
    np.testing.assert_allclose([losses(killed)[s] for s in range(7, STEPS + 1)],
                               [losses(reference)[s] for s in range(7, STEPS + 1)], rtol=1e-5, atol=0)

    # 4. The store alone answers the audit and the report (the logs were uploaded beside the checkpoints).
    from gristmill.cli import main

    capsys.readouterr()
    assert main(["audit", "seen", ckpt, "--verify-checkpoint", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == [1, STEPS]
    assert main(["report", ckpt, "--text"]) == 0
    page = capsys.readouterr().out
    assert "Young/Daly" in page and "hostnames" in page and meta12["run_record"]["tokenizer_sha256"] in page
