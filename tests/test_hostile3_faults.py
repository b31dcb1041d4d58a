"""Hostile environments (issue #33, third round): a full disk, a bad output path, an object store
that does not answer, SIGTERM, a run that keeps nothing. Each is one line on stderr and exit 2
(143 for SIGTERM, with the line saying the same command resumes), and nothing that looks like a
version or an export is left behind.

A full disk is a real one where this process may mount a small tmpfs (root in a container that
allows it); elsewhere, and always in the ``injected`` runs, writes under the directory go through
a fault-injecting ``open`` that raises ENOSPC once the space is used up, in this process: the
same gristmill code runs (the publish, the export, the task log), only the refusal is simulated.
"""
from __future__ import annotations

import builtins
import errno
import json
import logging
import os
import signal
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from gristmill import cli

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


# -- a full disk -------------------------------------------------------------------------------
class FullDisk:
    """A directory on a filesystem that is full but for ``fill(leave)`` bytes: a 1 MiB tmpfs, or
    (``injected``) a budget the patched ``open`` spends on every write under the directory."""

    def __init__(self, path: str, mounted: bool):
        self.path, self.mounted = path, mounted
        self.budget: float = float("inf")
        self.filler = os.path.join(path, ".filler")

    def fill(self, leave: int = 0) -> None:
        if not self.mounted:
            self.budget = leave
            return
        with open(self.filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        os.truncate(self.filler, max(0, os.path.getsize(self.filler) - leave))

    def free(self) -> None:
        self.budget = float("inf")
        if os.path.exists(self.filler):
            os.unlink(self.filler)


class _Spending:
    """A writable file under a FullDisk whose writes spend its budget (ENOSPC when it is spent)."""

    def __init__(self, f, disk: FullDisk):
        self._f, self._disk = f, disk

    def write(self, data):
        n = memoryview(data).nbytes if not isinstance(data, str) else len(data.encode())
        if n > self._disk.budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.budget -= n
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _try_mount(path: str) -> bool:
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", path], capture_output=True)
    return done.returncode == 0


@pytest.fixture(params=["tmpfs", "injected"])
def full_disk(request, tmp_path, monkeypatch):
    path = str(tmp_path / "disk")
    os.makedirs(path)
    mounted = request.param == "tmpfs" and _try_mount(path)
    disk = FullDisk(path, mounted)
    if not mounted:  # the fallback: the same code, with the refusal simulated at open()
        real_open = builtins.open

        def spending_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if (isinstance(file, (str, os.PathLike)) and set(mode) & set("wax+")
                    and os.path.abspath(file).startswith(path + os.sep)):
                return _Spending(f, disk)
            return f

        real_copyfile = shutil.copyfile

        def spending_copyfile(src, dst, *args, **kwargs):  # a publish's disk-to-disk copy is the kernel's
            if os.path.abspath(dst).startswith(path + os.sep):
                n = os.path.getsize(src)
                if n > disk.budget:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                disk.budget -= n
            return real_copyfile(src, dst, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", spending_open)
        monkeypatch.setattr(shutil, "copyfile", spending_copyfile)
    try:
        yield disk
    finally:
        if mounted:  # never leave a mount behind
            if subprocess.run(["umount", path], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", path], capture_output=True)


def _one_line(err: str, *parts: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err and "Logging error" not in err, err[-3000:]
    for p in parts:
        assert p in err, err
    return err


# -- a tiny prepare job -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import random

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    with open(root / "in.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"id": f"d{i}", "text": " ".join(rng.choice(WORDS) for _ in range(50))}) + "\n")
    return root


def _job(corpus, out, **output) -> str:
    job = {"inputs": [{"path": str(corpus / "in.jsonl"), "id_field": "id"}],
           "output": {"store": str(out / "store"), "dataset": "t", "report_html": False, **output},
           "work_dir": str(out / "work"), "language": {"enabled": False}, "split": {"validation_fraction": 0.0},
           "tokenizer": {"vocab_size": 300, "sample_bytes": 200_000}, "pack": {"seq_len": 32},
           "runner": {"kind": "local", "num_cpus": 1}}
    path = out / f"job-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def _versions(store: str, dataset: str = "t") -> list[str]:
    d = os.path.join(store, dataset)
    return sorted(n for n in os.listdir(d) if n.startswith("v")) if os.path.isdir(d) else []


# -- case 1: full disks, bad paths, an unreachable store ----------------------------------------
def test_a_full_store_is_one_line_leaves_no_version_and_the_rerun_publishes_v1(corpus, tmp_path, full_disk, capsys):
    from gristmill.manifests import load_manifest, verify_published

    store = os.path.join(full_disk.path, "store")
    job = _job(corpus, tmp_path, store=store)
    full_disk.fill(leave=16 << 10)  # room for the claim and a file or two, not for the version
    assert cli.main(["prepare", "--quiet", job]) == 2
    _one_line(capsys.readouterr().err, "gristmill prepare: error: cannot publish", store, "No space left on device",
              "free space", "nothing was published")
    assert _versions(store) == []  # no v1/ (.claim, shards, .tmp-*): nothing that looks like a version
    full_disk.free()
    assert cli.main(["prepare", "--quiet", job]) == 0  # the work dir resumes; the number is free again
    capsys.readouterr()
    assert _versions(store) == ["v1"]
    pub = load_manifest(os.path.join(store, "t"))
    assert pub.manifest.version == 1 and verify_published(pub) == []


def test_a_full_work_dir_task_log_fails_quietly(full_disk, capfd):
    """A task's log on a full work dir: no "--- Logging error ---" traceback per record (dozens
    of them came before the task's one-line error); the log is simply off."""
    from gristmill.pipeline.runner import task_log

    full_disk.fill()
    log = logging.getLogger("gristmill.test")
    with task_log(os.path.join(full_disk.path, "logs", "step", "task-000.log")):
        for i in range(20):
            log.warning("record %d quarantined", i)
    assert capfd.readouterr().err == ""


@pytest.fixture
def published(tmp_path):
    from helpers import build_dataset

    return build_dataset(str(tmp_path / "src"))


@pytest.mark.parametrize("fmt", ["megatron", "parquet"])
@pytest.mark.parametrize("where", ["proc", "file", "under-file"])
def test_export_to_a_bad_path_is_one_line(published, tmp_path, capsys, fmt, where):
    afile = tmp_path / "afile"
    afile.write_bytes(b"")
    out = {"proc": "/proc/nope/x", "file": str(afile), "under-file": str(afile / "x")}[where]
    rc = cli.main(["export", fmt, published.url, out])
    if fmt == "megatron" and where == "file":  # a prefix: afile.bin / .idx beside the file is fine
        assert rc == 0
        return
    assert rc == 2
    _one_line(capsys.readouterr().err, "gristmill export: error: ", "choose another output path")
    assert sorted(os.listdir(tmp_path)) == ["afile", "src"] and not os.path.exists("/proc/nope")


@pytest.mark.parametrize("fmt", ["megatron", "parquet"])
def test_export_to_a_full_disk_is_one_line_and_leaves_nothing(published, full_disk, capsys, fmt):
    out = os.path.join(full_disk.path, "out")
    full_disk.fill(leave=1 << 10)
    assert cli.main(["export", fmt, published.url, out]) == 2
    _one_line(capsys.readouterr().err, "gristmill export: error: cannot write the export", out,
              "No space left on device", "nothing was exported")
    assert sorted(os.listdir(full_disk.path)) == ([".filler"] if full_disk.mounted else [])


def test_audit_seen_a_path_that_is_not_there_is_one_line(tmp_path, capsys):
    assert cli.main(["audit", "seen", str(tmp_path / "typo")]) == 2
    _one_line(capsys.readouterr().err, "gristmill audit: error: no checkpoint at", "typo", "check the path")


@pytest.fixture
def s3_down(monkeypatch):
    """An S3 endpoint nobody answers on (a closed port of this machine), one attempt per request."""
    import socket

    import s3fs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from s3server import ENV

    for k, v in {**ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
                 "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()
    yield "s3://nobody-answers/store/t"
    s3fs.S3FileSystem.clear_instance_cache()


def test_manifest_show_and_audit_seen_with_the_endpoint_down_are_one_line(published, tmp_path, s3_down, capsys):
    from helpers import write_checkpoint_meta

    from gristmill.manifests import Published

    assert cli.main(["manifest", "show", s3_down]) == 2
    _one_line(capsys.readouterr().err, "gristmill manifest: error: cannot reach the object store", "AWS_ENDPOINT_URL")
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), Published(published.manifest, s3_down + "/v1"), step=1)
    assert cli.main(["audit", "seen", ckpt]) == 2
    _one_line(capsys.readouterr().err, "gristmill audit: error: cannot reach the object store")


# -- case 3: SIGTERM ---------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_during_prepare_is_one_line_exit_143_and_nothing_is_published(tmp_path):
    from helpers import demo_job_dict

    from gristmill.pipeline.demo_corpus import write_demo_corpus

    write_demo_corpus(str(tmp_path / "demo"))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(demo_job_dict(tmp_path / "demo", tmp_path, runner={"kind": "local", "num_cpus": 1})))
    proc = subprocess.Popen([sys.executable, "-m", "gristmill", "prepare", str(job)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180  # a hang guard, not a timing assertion
    while not list((tmp_path / "work").glob("*/_done/extract/*.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("gristmill: interrupted by SIGTERM") and "the same command resumes" in last, err[-3000:]
    assert "Traceback" not in err and not (tmp_path / "store" / "demo").exists()


# -- case 4: a run that keeps nothing ---------------------------------------------------------------
def test_a_run_that_keeps_nothing_publishes_nothing_unless_allowed(corpus, tmp_path, capsys):
    from gristmill.manifests import load_manifest

    store = str(tmp_path / "store")
    job = _job(corpus, tmp_path)
    assert cli.main(["prepare", "--quiet", job, "--set", "extract.min_chars=100000"]) == 2
    _one_line(capsys.readouterr().err, "gristmill prepare: error: the run kept no document of 30 input records",
              "quarantined empty 30", "output.allow_empty: true")
    assert _versions(store) == []
    assert cli.main(["prepare", "--quiet", job, "--set", "extract.min_chars=100000",
                     "--set", "output.allow_empty=true"]) == 0  # asked for: the same run, resumed, publishes
    capsys.readouterr()
    assert load_manifest(os.path.join(store, "t")).manifest.stats["accounting"]["kept"] == 0


# -- case 2: concurrent prepares on S3 ---------------------------------------------------------------
@pytest.mark.slow
def test_concurrent_prepares_on_s3_publish_once(corpus, tmp_path, s3, s3_server):
    """Three prepares of one job at once, work dir and store on S3: one version (the store-level
    race, with threads and processes, is tests/test_store_concurrency.py's)."""
    from gristmill.manifests import ManifestStore, verify_published

    job = yaml.safe_load(open(_job(corpus, tmp_path)))
    job["output"]["store"], job["work_dir"] = f"{s3}/store", f"{s3}/work"
    path = tmp_path / "s3-job.yaml"
    path.write_text(yaml.safe_dump(job))
    procs = [subprocess.Popen([sys.executable, "-m", "gristmill", "prepare", "--quiet", str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **s3_server.env}) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-3000:] for _, err in outs]
    assert all("published t v1 " in out for out, _ in outs), outs
    store = ManifestStore(f"{s3}/store")
    assert store.versions("t") == [1] and store._taken(store._root_path + "/t") == [1]
    assert verify_published(store.load("t")) == []
