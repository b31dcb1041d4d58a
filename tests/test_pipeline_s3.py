"""`prepare` with its inputs, work dir and store on S3 (the local moto server, tests/s3server.py):
the same manifest hash as the run with a local work dir and store, and a kill -9 mid-run then a
rerun on S3 reaches it too. Each run is its own `gristmill prepare` process (with the server's
endpoint and fake credentials in its environment), as a user runs it."""
import json
import os
import signal
import subprocess
import sys
import time

import fsspec
import pytest
import yaml

from helpers import demo_job_dict

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from gristmill.pipeline.demo_corpus import write_demo_corpus

    out = tmp_path_factory.mktemp("demo")
    write_demo_corpus(str(out))
    return out


def _job(corpus, inputs_root: str, out: str) -> dict:
    """The demo job (quality, fuzzy dedup and decontamination on) reading the corpus under ``inputs_root``."""
    d = demo_job_dict(corpus, corpus, quality={}, fuzzy_dedup={"threshold": 0.8},
                      decontaminate={"eval_sets": [{"name": "demo_qa", "path": f"{inputs_root}/evals/demo_qa.jsonl",
                                                    "id_field": "id"}]},
                      runner={"num_cpus": 2}, partitioning={"partition_bytes": 300_000})  # ~4 partitions: every step has parallel tasks, and
    # each S3 request to the single-threaded local server costs milliseconds (27 partitions took ~2 minutes)
    d["inputs"] = [json.loads(json.dumps(i).replace(str(corpus), inputs_root)) for i in d["inputs"]]
    d["output"]["store"], d["work_dir"] = f"{out}/store", f"{out}/work"
    return d


def _start(job: dict, where, env: dict) -> subprocess.Popen:
    path = where / f"job-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(job))
    return subprocess.Popen([sys.executable, "-m", "gristmill", "prepare", str(path)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def _finish(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    return err


def _latest_sha(store: str) -> str:
    from gristmill.manifests import load_manifest

    return load_manifest(f"{store}/demo").manifest.sha256


def test_prepare_on_s3_same_hash_and_kill_rerun(corpus, tmp_path, s3, s3_server):
    from gristmill.manifests import load_manifest, verify_published

    fs = fsspec.filesystem("s3")
    bucket = s3[len("s3://"):]
    fs.put(str(corpus / "corpus"), f"{bucket}/demo/corpus", recursive=True)
    fs.put(str(corpus / "evals"), f"{bucket}/demo/evals", recursive=True)
    inputs = f"{s3}/demo"

    local = _job(corpus, inputs, str(tmp_path / "local"))  # inputs on S3 (same URIs), work dir and store local
    _finish(_start(local, tmp_path, s3_server.env))
    reference = _latest_sha(local["output"]["store"])

    remote = _job(corpus, inputs, f"{s3}/run")  # everything on S3, the data card too
    remote["output"]["report_html"] = True
    remote_err = _finish(_start(remote, tmp_path, s3_server.env))
    assert _latest_sha(remote["output"]["store"]) == reference
    pub = load_manifest(f"{s3}/run/store/demo")
    assert verify_published(pub) == []
    run_dir = f"{bucket}/run/work"
    assert fs.glob(f"{run_dir}/*/_done/fuzzy_dedup.verify/*.json") and fs.glob(f"{run_dir}/*/removed/*/*.parquet")
    assert not [p for p in fs.find(f"{bucket}/run") if ".tmp-" in p]  # nothing on S3 was written under a temp name

    # what the run removed and its data card read back from the S3 work dir as from the local one
    from gristmill.pipeline.removals import removed_documents
    from gristmill.report.workfiles import find_run_dir

    on_s3 = removed_documents(f"{s3}/run/work", limit=50)
    on_disk = removed_documents(local["work_dir"], limit=50)
    assert on_s3["run_dir"].startswith(f"{s3}/run/work/") and on_s3["documents"] == on_disk["documents"]
    assert on_s3["removed_by_reason"] == on_disk["removed_by_reason"] and on_s3["documents"]
    assert find_run_dir(f"{s3}/run/work", reference) == on_s3["run_dir"]
    assert f"[report] {on_s3['run_dir']}/report.html" in remote_err, remote_err[-3000:]  # prepare wrote the data card there
    card = fs.cat_file(f"{on_s3['run_dir'][len('s3://'):]}/report.html").decode()
    assert "<html" in card.lower() and "near_duplicate" in card

    # kill -9 mid-run (the driver, the embedded Ray and its workers), then rerun: same hash
    killed = _job(corpus, inputs, f"{s3}/killed")
    proc = _start(killed, tmp_path, s3_server.env)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if fs.glob(f"{bucket}/killed/work/*/_done/exact_dedup/*.json"):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "prepare finished before the kill point"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    fs.invalidate_cache()
    assert not fs.exists(f"{bucket}/killed/store/demo/latest")  # it died before publishing
    _finish(_start(killed, tmp_path, s3_server.env))
    assert _latest_sha(killed["output"]["store"]) == reference
