"""deploy/gpu-benchmark.sh in its CPU dry-run mode (GPU_BENCH_PRESET=tiny), with checkpoints to a local
moto S3 server (GPU_BENCH_CKPT_EVERY): the same script a GPU machine runs in one go, end to end, so it is
ready when one is lent."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow


def test_the_gpu_benchmark_dry_run_records_throughput_budget_and_a_loss_curve(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "GPU_BENCH_PRESET": "tiny", "GPU_BENCH_SECONDS": "4", "OUT": str(out),
           "GPU_BENCH_WORK": str(tmp_path / "work"), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "WHEELS": "",  # none: this venv has them (a .whl/ may hold a device's)
           "GPU_BENCH_CKPT_EVERY": "2"}  # checkpoints to a local moto S3 server, through local disk
    proc = subprocess.run(["bash", os.path.join(ROOT, "deploy", "gpu-benchmark.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["environment.txt", "loss_curve.csv", "metrics.jsonl", "results.json",
                                       "results.md", "train.log"]  # at most 8 files come back from a device run
    r = json.loads((out / "results.json").read_text())
    assert r["preset"] == "tiny" and r["steps"] > 2 and r["tokens_per_s_per_device"] > 0
    assert r["mfu"] is None and r["max_allocated_bytes"] is None  # a CPU: no peak, no CUDA allocator
    assert r["budget_bytes"] == sum(r["budget_terms"].values()) > 0
    assert [c["step"] for c in r["loss_curve"]] == list(range(1, r["steps"] + 1))
    assert r["loss_last"] < r["loss_first"]  # the counting rows are learnable
    assert "SIGTERM after step" in (out / "train.log").read_text()  # stopped by the clock, cleanly
    assert "| tokens/s per device |" in (out / "results.md").read_text()
    saves = r["checkpoints"]  # every 2 steps, and the last at the SIGTERM stop
    assert len(saves) >= 2 and all(c["blocked_s"] > 0 and c["step"] % 2 == 0 for c in saves[:-1])
    assert "| checkpoint: training blocked per save (to s3://" in (out / "results.md").read_text()
    assert "committed checkpoint s3://gpu-bench/run/checkpoints/step-" in (out / "train.log").read_text()
    # the checkout ran through the script's links (a machine without an install), not an installed copy
    # every part of the package is linked, subpackages too (gristmill.cli was missing on the first device run)
    assert (tmp_path / "work" / "site" / "gristmill" / "cli" / "train.py").exists()
    assert f"gristmill: {tmp_path / 'work' / 'site' / 'gristmill' / 'trainer'}" in (out / "environment.txt").read_text()
