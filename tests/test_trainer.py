"""The trainer end to end on CPU with gloo: real torchrun subprocesses, a tiny model, a few steps.

Tolerances: runs on one process are compared bitwise (fp32, same op order); runs at a different
world size are compared to 1e-5 relative, the float reordering of a sum over two ranks.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from helpers import Evil, build_dataset, flip_byte, kill_at_marker, reseal_meta
from gristmill.manifests.synthetic import build_synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "configs", "train-tiny.yaml")
STEPS = 12
REL_TOL = 1e-5

pytestmark = pytest.mark.slow


# -- helpers ----------------------------------------------------------------------------------
LAUNCHER = os.path.join(ROOT, "tests", "fault_launcher.py")


def build_learnable(root: str) -> str:
    """A dataset a tiny model learns in a few steps: each row counts up by 1 or 2 from a random start."""
    return build_synthetic(root, dataset="count", vocab_size=64, shard_rows=(48, 48), val_rows=(16,),
                           tokens="counting").url


def train(manifest: str, run_dir: str, *sets: str, nproc: int = 1, extra=(), faults=(), check=True,
          popen=False, cli=False, log_samples=True):
    """Run ``python -m gristmill.trainer`` (``gristmill train`` with ``cli``, torchrun with ``nproc`` > 1,
    tests/fault_launcher.py with ``faults``) on the tiny job. ``log_samples``: write samples.jsonl,
    the first-hand record of the indices the tests compare (off by default in the trainer)."""
    launcher = [sys.executable, "-m", "gristmill.cli", "train"] if cli else [sys.executable, "-m", "gristmill.trainer"]
    if faults:
        launcher = [sys.executable, LAUNCHER] + [f"--fault={f}" for f in faults]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                    "-m", "gristmill.trainer"]
    args = ["--set", f"data.manifest={manifest}", "--set", f"run.dir={run_dir}", "--set", f"data.cache_dir={run_dir}-cache",
            "--set", f"run.steps={STEPS}", "--set", "checkpoint.every=4", "--set", "eval.every=6",
            "--set", "run.tensorboard=false", "--set", f"run.log_samples={str(log_samples).lower()}"]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = launcher + [JOB] + args + list(extra)
    if popen:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-20000:]}")
    return proc


def records(run_dir: str, kind: str = "train") -> dict[int, dict]:
    """The last record of each step (a resumed run appends; later lines win)."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r["kind"] == kind:
                out[r["step"]] = r
    return out


def losses(run_dir: str) -> list[float]:
    return [r["loss"] for _, r in sorted(records(run_dir).items())]


def samples(run_dir: str) -> list[tuple[int, list[int]]]:
    with open(os.path.join(run_dir, "samples.jsonl")) as f:
        return [(r["step"], r["indices"]) for r in map(json.loads, f)]


def meta(run_dir: str, step: int) -> dict:
    with open(os.path.join(run_dir, "checkpoints", f"step-{step}", "meta.json")) as f:
        return json.load(f)


def assert_close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b)
    np.testing.assert_allclose(a, b, rtol=REL_TOL, atol=0)


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return build_learnable(str(tmp_path_factory.mktemp("count")))


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """One uninterrupted single-process run of STEPS steps: what every other run is compared to."""
    run_dir = str(tmp_path_factory.mktemp("reference"))
    train(data, run_dir)
    return run_dir


# -- tests ----------------------------------------------------------------------------------
def test_loss_falls_and_everything_is_recorded(reference, data):
    train_loss = losses(reference)
    assert len(train_loss) == STEPS
    assert np.mean(train_loss[-3:]) < np.mean(train_loss[:3]) - 0.5
    val = records(reference, "eval")
    assert sorted(val) == [6, 12] and val[12]["val_loss"] < val[6]["val_loss"]
    last = records(reference)[STEPS]
    for key in ("grad_norm", "lr", "tokens_per_s", "input_wait_s", "input_wait_pct", "rank_step_s"):
        assert key in last
    assert last["mfu"] is None  # a CPU is not in the peak table: no guessed MFU
    # step n consumed global sample indices [(n-1)*B, n*B)
    assert samples(reference) == [(n, list(range((n - 1) * 8, n * 8))) for n in range(1, STEPS + 1)]
    m = meta(reference, STEPS)
    assert m["step"] == STEPS and m["tokens_seen"] == STEPS * 8 * 16 and m["world_size"] == 1
    assert m["loader"]["next_index"] == STEPS * 8 and m["data"]["manifest_url"] == data
    assert m["job"]["data"]["manifest"] == data and len(m["rng"]) == 1 and m["files"]
    assert sorted(os.listdir(os.path.join(reference, "checkpoints"))) == ["step-12", "step-8"]  # keep: 2


def test_two_processes_match_one_process(reference, data, tmp_path):
    # 2 ranks x 2 micro-batches of 2 (gradient accumulation, sync on the last) vs 1 rank x 8.
    run_dir = str(tmp_path / "two")
    train(data, run_dir, "data.micro_batch=2", nproc=2)
    assert_close(losses(run_dir), losses(reference))
    assert samples(run_dir) == samples(reference)
    assert meta(run_dir, STEPS)["world_size"] == 2 and len(meta(run_dir, STEPS)["rng"]) == 2


def test_interrupt_and_resume_is_bitwise(reference, data, tmp_path):
    run_dir = str(tmp_path / "resumed")
    train(data, run_dir, extra=["--stop-after-step", "5"])
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["step-4", "step-5"]
    out = train(data, run_dir)
    assert "resumed from" in out.stderr and "step-5" in out.stderr
    assert losses(run_dir) == losses(reference)  # bitwise: fp32 on one process
    assert samples(run_dir) == samples(reference)
    assert meta(run_dir, STEPS)["resumed_from"].endswith("step-5")


def test_kill_during_checkpoint_save_resumes_from_previous(reference, data, tmp_path):
    run_dir = str(tmp_path / "killed")
    proc = train(data, run_dir, faults=["hang_before_commit@8"], popen=True)
    kill_at_marker(proc, os.path.join(run_dir, "HANGING-hang_before_commit-8"), "the step-8 save")
    ckpts = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    assert ckpts == ["step-4", "step-8"]  # the half-written save never looks committed: it has no meta.json
    assert not os.path.exists(os.path.join(run_dir, "checkpoints", "step-8", "meta.json"))
    out = train(data, run_dir)
    assert "step-4" in out.stderr
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["step-12", "step-8"]
    assert losses(run_dir) == losses(reference)
    assert samples(run_dir) == samples(reference)


def test_corrupt_newest_checkpoint_falls_back_to_previous(reference, tmp_path):
    from gristmill.trainer.checkpoint import find_resumable

    run_dir = str(tmp_path / "corrupt")
    shutil.copytree(reference, run_dir)
    flip_byte(os.path.join(run_dir, "checkpoints", "step-12", "__0_0.distcp"))
    path, passed_over = find_resumable(run_dir)
    assert path.endswith("step-8")
    assert len(passed_over) == 1 and "step-12" in passed_over[0] and "__0_0.distcp: sha256" in passed_over[0]


def test_resume_at_world_size_two_to_one_continues_the_sample_order(reference, data, tmp_path):
    run_dir = str(tmp_path / "ws")
    # The 2-rank half also exercises async checkpoints: its step-6 save is committed after the fact.
    train(data, run_dir, "checkpoint.async_save=true", "checkpoint.every=3", nproc=2, extra=["--stop-after-step", "6"])
    assert meta(run_dir, 6)["world_size"] == 2
    out = train(data, run_dir)
    assert "step-6" in out.stderr and "world size 2 -> 1" in out.stderr
    assert samples(run_dir) == samples(reference)
    assert_close(losses(run_dir), losses(reference))
    assert meta(run_dir, STEPS)["world_size"] == 1


def test_mismatched_manifest_is_refused_unless_overridden(reference, tmp_path):
    other = build_dataset(str(tmp_path / "other"), vocab_size=64, seed=3).url
    run_dir = str(tmp_path / "mismatch")
    shutil.copytree(reference, run_dir)
    ref_sha = meta(reference, STEPS)["data"]["manifest_sha256"]
    refused = train(other, run_dir, f"run.steps={STEPS + 2}", check=False, cli=True)  # through `gristmill train`
    assert refused.returncode == 2
    assert ref_sha in refused.stderr and "--allow-manifest-change" in refused.stderr
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["step-12", "step-8"]  # untouched

    train(other, run_dir, f"run.steps={STEPS + 2}", extra=["--allow-manifest-change"])
    changes = meta(run_dir, STEPS + 2)["manifest_changes"]
    assert len(changes) == 1 and changes[0]["from_sha256"] == ref_sha and changes[0]["step"] == STEPS
    assert changes[0]["to_url"] == other


def test_non_finite_steps_are_skipped_then_stop_the_run(data, tmp_path):
    # Step 2 alone is skipped and training recovers; steps 4, 5, 6 in a row stop the run. The step-3
    # save's upload is still running then (slow_upload): the stop commits it first, the checkpoint its
    # message says to resume from (the process exited without it, and CI once failed on a slow machine).
    run_dir = str(tmp_path / "nan")
    failed = train(data, run_dir, "optimizer.max_bad_steps=3", "eval.every=0", "checkpoint.every=3",
                   faults=["nan_loss@2", "nan_loss@4", "nan_loss@5", "nan_loss@6", "slow_upload@3"], check=False,
                   log_samples=False)
    assert failed.returncode == 2
    assert not os.path.exists(os.path.join(run_dir, "samples.jsonl"))  # opt-in: no per-step gather by default
    assert "3 consecutive steps (up to step 6)" in failed.stderr and "max_bad_steps=3" in failed.stderr
    recs = records(run_dir)
    assert [recs[s]["skipped"] for s in range(1, 7)] == [False, True, False, True, True, True]
    assert recs[6]["skipped_total"] == 4
    assert all(np.isfinite(recs[s]["loss"]) for s in (1, 3))
    assert meta(run_dir, 3)["bad_steps"] == {"skipped_total": 1, "consecutive": 0}
    # step 2's samples trained nothing: recorded for the audit (trainer/skips.py), which leaves them out
    assert [(r["kind"], r["start"], r["end"], r["step"]) for r in meta(run_dir, 3)["skips"]] == [("bad_step", 8, 16, 2)]


def test_resume_passes_over_forged_checkpoints_without_running_their_code(reference, data, tmp_path):
    """step-12's DCP .metadata runs `touch` when unpickled; step-8's meta.json has a consistently
    edited seed and a fresh self-hash. Both have meta.json file hashes that match: resume must
    refuse both, name why, and start over, and the payload never runs."""
    import pickle

    from gristmill.trainer.checkpoint import read_dcp_metadata

    run_dir = str(tmp_path / "forged")
    shutil.copytree(reference, run_dir)
    marker = str(tmp_path / "PWNED")
    step12, step8 = (os.path.join(run_dir, "checkpoints", f"step-{n}") for n in (12, 8))
    md = read_dcp_metadata(step12)
    md.planner_data = Evil(marker)
    with open(os.path.join(step12, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    reseal_meta(step12, lambda m: None, files=True)

    def edit(m):
        m["loader"]["seed"] = m["job"]["data"]["seed"] = 1

    reseal_meta(step8, edit)
    out = train(data, run_dir, extra=["--stop-after-step", "1"])
    assert re.search(r"not resuming from step-12: .*refusing to unpickle (posix|os)\.system", out.stderr)
    assert "not resuming from step-8: " in out.stderr and "loader.seed is 1 in meta.json but 0 in the DCP state" in out.stderr
    assert "resumed from" not in out.stderr and samples(run_dir)[-1] == (1, list(range(8)))
    assert not os.path.exists(marker)


def test_sigint_stops_within_a_step_and_leaves_a_valid_checkpoint(data, tmp_path):
    from gristmill.trainer.checkpoint import find_resumable

    run_dir = str(tmp_path / "sigint")
    proc = train(data, run_dir, "run.steps=100000", "checkpoint.every=1", "eval.every=0", popen=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if m := re.search(r"step +(\d+)  loss", line):
            sent_after = int(m.group(1))
            os.kill(proc.pid, signal.SIGINT)
            break
    else:
        raise AssertionError("the trainer never logged a step:\n" + "".join(seen[-50:]))
    rest = proc.communicate(timeout=120)[0]  # a hang guard, not a timing assertion
    assert proc.returncode == 130, rest[-3000:]
    last = max(records(run_dir))
    assert last <= sent_after + 2  # the step running when the signal came, at most one more queued in the pipe
    assert f"gristmill train: SIGINT after step {last}: stopped; the newest checkpoint is" in rest
    assert "Traceback" not in rest
    path, passed_over = find_resumable(run_dir)
    assert path.endswith(f"step-{last}") and passed_over == []
