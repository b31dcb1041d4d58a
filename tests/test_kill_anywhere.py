"""kill -9 anywhere: `prepare` killed inside every stage (fuzzy dedup's sub-steps, pack and
publish included), sometimes killed again during the rerun, always ends with the uninterrupted
run's manifest hash and exact accounting. A bounded, seeded set of trials (slow suite)."""
import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from helpers import demo_job_dict

pytestmark = pytest.mark.slow

# Where to strike: the first file matching the pattern appears (a task of that step committed,
# so the step is under way), then a random delay of 0-150 ms.
KILL_POINTS = [
    ("extract", "work/*/_done/extract/*.json"),
    ("exact_dedup", "work/*/_done/exact_dedup/*.json"),
    ("quality", "work/*/_done/quality/*.json"),
    ("fuzzy_dedup", "work/*/_done/fuzzy_dedup.verify/*.json"),
    ("decontaminate", "work/*/_done/decontaminate/*.json"),
    ("tokenize", "work/*/_done/tokenize/*.json"),
    ("pack", "work/*/_done/pack/*.json"),
    ("publish", "store/demo/v1/shards/*.arrow"),
]
SECOND_KILL = {"fuzzy_dedup", "tokenize"}  # these trials are killed again during the rerun


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from gristmill.pipeline.demo_corpus import write_demo_corpus

    out = tmp_path_factory.mktemp("demo")
    write_demo_corpus(str(out))
    with open(out / "evals" / "demo_qa.jsonl") as f:
        assert f.readline()  # the demo writes an eval set to decontaminate against
    return out


def _job(corpus, out) -> dict:
    return demo_job_dict(
        corpus, out, quality={}, fuzzy_dedup={"threshold": 0.8},
        decontaminate={"eval_sets": [{"name": "demo_qa", "path": str(corpus / "evals" / "demo_qa.jsonl"), "id_field": "id"}]},
        runner={"num_cpus": 2}, partitioning={"partition_bytes": 1})  # a partition per file: many tasks per step to land between


def _cmd(job_path):
    return [sys.executable, "-m", "gristmill", "prepare", str(job_path)]


def _kill_at(cmd, out, pattern, delay) -> bool:
    """Start prepare, kill its whole process group once ``pattern`` matches; False if it finished first."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not glob.glob(str(out / pattern)):
        time.sleep(0.01)
    time.sleep(delay)
    alive = proc.poll() is None
    if alive:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, the embedded Ray and its workers
    proc.wait()
    return alive


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    job = out / "job.yaml"
    job.write_text(yaml.safe_dump(_job(corpus, out)))
    done = subprocess.run(_cmd(job), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (report,) = glob.glob(str(out / "work" / "*" / "report.json"))
    with open(report) as f:
        return json.load(f)


@pytest.mark.parametrize("stage,pattern", KILL_POINTS, ids=[k for k, _ in KILL_POINTS])
def test_kill_9_anywhere_then_rerun_gives_the_same_hash(corpus, reference, tmp_path, stage, pattern):
    rng = random.Random(f"kill-{stage}")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(_job(corpus, tmp_path)))
    killed = _kill_at(_cmd(job), tmp_path, pattern, rng.uniform(0, 0.15))
    assert killed, f"prepare finished before the kill inside {stage}"
    if stage != "publish":
        assert not glob.glob(str(tmp_path / "store" / "demo" / "v*" / "manifest.json"))
    if stage in SECOND_KILL:  # killed again while the rerun is in the next step's tasks
        _kill_at(_cmd(job), tmp_path, "work/*/_done/tokenizer/*.json" if stage != "tokenize" else "work/*/_done/pack/*.json",
                 rng.uniform(0, 0.15))
    committed = glob.glob(str(tmp_path / pattern)) if pattern.startswith("work/") else []
    rerun = subprocess.run(_cmd(job), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert reference["manifest_sha256"] in rerun.stdout
    if committed:  # resume is per task: every task committed before the kill is skipped, not redone
        step = pattern.split("/")[3]
        skipped = re.search(rf"\[{re.escape(step)}\] (\d+) of (\d+) tasks already done", rerun.stderr)
        assert skipped and len(committed) <= int(skipped.group(1)), rerun.stderr[-3000:]
    (report,) = glob.glob(str(tmp_path / "work" / "*" / "report.json"))
    with open(report) as f:
        got = json.load(f)
    assert got["accounting"] == reference["accounting"] and got["accounting"]["balanced"]
    assert got["manifest_sha256"] == reference["manifest_sha256"]
