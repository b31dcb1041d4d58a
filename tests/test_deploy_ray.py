"""`gristmill prepare` on a real two-node Ray cluster on this machine, submitted through the Ray
Jobs API, as an operator does with `ray job submit` (docs/deploy.md), and the faults such a cluster
meets (issue 23): a worker process killed with SIGKILL mid-task, and the second node's raylet killed
mid-stage. Both must cost a retry of the lost tasks, never the job: it finishes on its first
submission with the same manifest hash as an uninterrupted local run and the same accounting.

The cluster (tests/ray_cluster.py) is two `ray start --block` processes (a head and a worker node,
one CPU each) with their own temp dir and ports, so they never meet the test session's Ray.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import time

import pytest
import yaml

from corpus_split import write_split_corpus
from ray_cluster import GRISTMILL, TASK_TITLES, kill_mid_stage_and_wait, ray_cluster, submit_prepare, wait_for_job

WORDS = ("the river runs past the old mill where farmers bring their grain every autumn and the miller "
         "weighs each sack before the stones turn it into flour for the bakers of the town").split()


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
def test_prepare_on_two_node_ray_cluster_matches_single_process(tmp_path, request):
    from ray.job_submission import JobStatus

    from gristmill.manifests import ManifestStore, verify_published
    from gristmill.pipeline.config import load_job
    from gristmill.pipeline.executor import prepare

    corpus = write_corpus(str(tmp_path / "corpus"))
    cluster_job = write_job(str(tmp_path / "cluster-job.yaml"), corpus, str(tmp_path / "cluster"))
    local_job = write_job(str(tmp_path / "local-job.yaml"), corpus, str(tmp_path / "local"))

    with ray_cluster(str(tmp_path), nodes=2) as cluster:
        assert len(set(cluster.node_ids)) == 2
        client, job_id = submit_prepare(cluster, cluster_job)
        status = wait_for_job(client, job_id)
        logs = client.get_job_logs(job_id)
        assert status == JobStatus.SUCCEEDED, f"job {job_id} ended {status}:\n{logs[-4000:]}"
        job_hex = client.get_job_info(job_id).job_id
        ran_on = pipeline_task_nodes(cluster.dashboard, job_hex)
    assert ran_on == set(cluster.node_ids), f"pipeline tasks ran on {sorted(ran_on)}, cluster nodes are {sorted(cluster.node_ids)}"

    distributed = ManifestStore(str(tmp_path / "cluster" / "store")).load("tiny")
    assert verify_published(distributed) == []
    assert distributed.manifest.stats  # a real run: documents went through every stage
    # The reference: the same job in this process, on the test session's local Ray (started only
    # now, once the cluster is gone: never two Rays at once).
    request.getfixturevalue("ray_session")
    single = prepare(load_job(local_job), quiet=True)
    assert distributed.manifest.sha256 == single.manifest_sha256, "the cluster run published different bytes"


# -- faults: a lost worker, a lost node ------------------------------------------------------------
# 8 partitions of ~0.75 MB: every per-partition task runs for a few hundred ms, long enough to be
# found running and killed; planted exact and near duplicates, so dedup's global steps have work.
FAULT_CORPUS = {"files": 8, "docs_per_file": 300, "paragraphs_per_doc": 10}


def fault_job(corpus: str, out: str) -> str:
    job = {
        "inputs": [os.path.join(corpus, "*.jsonl")],
        "output": {"store": os.path.join(out, "store"), "dataset": "faults", "report_html": False},
        "work_dir": os.path.join(out, "work"),
        "language": {"allowed": ["en"], "threshold": 0.3},
        "fuzzy_dedup": {"threshold": 0.8},
        "split": {"validation_fraction": 0.05},
        "tokenizer": {"vocab_size": 512, "sample_bytes": 300_000},
        "pack": {"seq_len": 128, "shard_bytes": 200_000},
        "partitioning": {"partition_bytes": 1},  # a partition per file
    }
    path = os.path.join(out, "job.yaml")
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        yaml.safe_dump(job, f)
    return path


def run_report(out: str) -> dict:
    (report,) = glob.glob(os.path.join(out, "work", "*", "report.json"))
    with open(report) as f:
        return json.load(f)


def retries(report: dict) -> int:
    """Tasks Ray ran again after a system failure, as report.json counts them (``retries``: a count,
    or per step with a ``total``)."""
    r = report["retries"]
    return int(r["total"] if isinstance(r, dict) else r)


@pytest.fixture(scope="module")
def fault_reference(tmp_path_factory):
    """The corpus, and the report of the same job run uninterrupted on one machine (embedded Ray, in a
    subprocess that has stopped before any cluster starts)."""
    root = tmp_path_factory.mktemp("faults")
    corpus = str(root / "corpus")
    write_split_corpus(corpus, **FAULT_CORPUS)
    out = str(root / "reference")
    done = subprocess.run([*GRISTMILL, "prepare", fault_job(corpus, out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = run_report(out)
    assert report["accounting"]["balanced"]
    return corpus, report


@pytest.mark.slow
@pytest.mark.parametrize("what,after", [
    ("worker", "_done/extract/*.json"),  # a worker process SIGKILLed while it runs an extract task
    ("node", "_done/tokenize/*.json"),  # the second node's raylet SIGKILLed while tokenize runs there
], ids=["worker", "node"])
def test_lost_worker_or_node_is_retried_not_fatal(tmp_path, fault_reference, what, after):
    from gristmill.manifests import ManifestStore, verify_published

    corpus, reference = fault_reference
    out = str(tmp_path / "run")
    job = fault_job(corpus, out)
    with ray_cluster(str(tmp_path), nodes=2) as cluster:
        client, job_id = submit_prepare(cluster, job)
        killed = kill_mid_stage_and_wait(cluster, client, job_id, what, os.path.join(out, "work", "*"),
                                         after=os.path.join(out, "work", "*", after))
    assert killed["status"] == "SUCCEEDED", f"the job ended {killed['status']} after the {what} was killed " \
                                            f"({killed['victim']}):\n{killed['logs'][-4000:]}"
    if what == "worker":
        assert killed["victim"].startswith(TASK_TITLES), killed  # it was running a pipeline task
    else:
        assert killed["node"] == 1 and "raylet" in killed["victim"], killed
        # The driver's terminal (the job's log) keeps to gristmill's lines: Ray's messages about the
        # lost node (~45 lines of raylet log before) are in the run dir's log, one line each here.
        terminal = killed["logs"]
        assert "(raylet)" not in terminal and "[state-dump]" not in terminal, terminal[-4000:]
        (ray_log,) = glob.glob(os.path.join(out, "work", "*", "logs", "ray", "driver.log"))
        assert "(raylet)" in open(ray_log).read()
        shown = [line for line in terminal.splitlines() if "gristmill.pipeline.runners.ray: Ray: " in line]
        assert shown and all(line.endswith(f"(Ray's whole message: {ray_log})") for line in shown), terminal[-4000:]
    report = run_report(out)
    assert report["manifest_sha256"] == reference["manifest_sha256"], "a retried task changed the published bytes"
    assert report["accounting"] == reference["accounting"] and report["accounting"]["balanced"]
    # (a node's batch committed the instant before the kill may have been delivered: then nothing to retry)
    assert (retries(report) >= 1 or killed["committed"]) and retries(reference) == 0, \
        f"report.json does not count the retried task: {report.get('retries')} (uninterrupted: {reference.get('retries')})"
    published = ManifestStore(os.path.join(out, "store")).load("faults")
    assert verify_published(published) == []
    assert published.manifest.version == 1  # one submission, one version: no rerun
