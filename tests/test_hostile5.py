"""Hostile inputs, fourth round (issue 39), what was left: a work dir that opens only with the
job's ``work_dir_options`` read by ``report --work-dir`` and ``inspect removed``; an object store's
file failing to close in a worker kept in the task's log; Ray's own lines kept off the terminal."""
import json
import os
import uuid

import pytest
import yaml

from gristmill import cli

from test_hostile4 import _job, _texts, _write_jsonl


# -- work_dir_options reach `report --work-dir` and `inspect removed` ---------------------------------
@pytest.fixture
def ticketed_run(tmp_path):
    """A published version whose work dir lives on a store that opens only with its ticket, given in
    the job's work_dir_options alone; (dataset URL, work dir URL, report's run dir). Exact duplicates
    planted, so there are removals to inspect."""
    from test_storage import _ticketed

    from gristmill.manifests.storage import FsspecStore

    _ticketed("gmticket5", "ok")
    os.makedirs(tmp_path / "in")
    texts = _texts(8, 30)
    _write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(texts + texts[:3])])
    out = tmp_path / "run"
    os.makedirs(out)
    work = f"gmticket5://w-{uuid.uuid4().hex[:8]}"
    job = _job([{"path": str(tmp_path / "in" / "a.jsonl"), "id_field": "id"}], out, work_dir=work,
               work_dir_options={"ticket": "ok"}, runner="serial")
    try:
        assert cli.main(["prepare", "--quiet", job]) == 0
        yield f"{out}/store/t", work
    finally:
        FsspecStore.kinds.pop("gmticket5", None)


def test_report_reads_and_writes_a_work_dir_that_needs_its_options(ticketed_run, tmp_path, capsys):
    from gristmill.manifests.storage import Store

    dataset, work = ticketed_run
    capsys.readouterr()
    assert cli.main(["report", dataset, "--work-dir", work, "--work-dir-option", "ticket=ok", "--text"]) == 0
    text = capsys.readouterr().out
    assert "was not found" not in text and "Work dir" not in text, text[:2000]  # the run dir's figures are in
    # the default --out is report.html in the run dir: written with the same options
    (opts := tmp_path / "opts.yaml").write_text(yaml.safe_dump({"ticket": "ok"}))
    assert cli.main(["report", dataset, "--work-dir", work, "--work-dir-options-file", str(opts)]) == 0
    store = Store.from_url(work, ticket="ok")
    (run,) = store.listdir(work)
    assert store.exists(f"{work}/{run}/report.html")
    assert capsys.readouterr().out.startswith(f"wrote {work}/{run}/report.html")


def test_inspect_removed_reads_a_work_dir_that_needs_its_options(ticketed_run, capsys):
    _, work = ticketed_run
    capsys.readouterr()
    assert cli.main(["inspect", "removed", work, "--json", "--work-dir-option", "ticket=ok"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["removed_by_reason"] == {"exact_duplicate": 3}, result["removed_by_reason"]
    assert {d["id"] for d in result["documents"]} == {"a30", "a31", "a32"}
    assert all(d["text"] and d["survivor"]["text"] == d["text"] for d in result["documents"])


# -- an object store's file failing to close in a worker: into the task's log, off the terminal -------
def _fails_with_an_upload_left_open():
    """A step function (a closure: it travels by value to any worker) whose task fails with an s3fs-like
    upload still open: its store is gone, so the file fails again when it is collected and closes."""
    def task(item):
        from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

        class Gone(AbstractBufferedFile):  # s3fs's upload, its server gone (a moto server restarted empty)
            def _initiate_upload(self):
                pass

            def _upload_chunk(self, final=False):
                raise ConnectionError("the object store went away")

        upload = Gone(AbstractFileSystem(), "bucket/key", mode="wb")
        upload.write(b"x" * 10)
        raise ConnectionError(f"cannot upload {upload.path}: the object store went away")
    return task


@pytest.mark.parametrize("kind", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_store_file_failing_to_close_in_a_worker_goes_to_the_task_log(kind, tmp_path, capfd, request):
    """A local pool's workers write to the user's terminal (their stderr is the driver's), Ray's to their
    worker log: Python's ~30-line "Exception ignored" must reach neither, and the task's log keeps it."""
    from gristmill.pipeline.config import RunnerConfig
    from gristmill.pipeline.runner import TaskError
    from gristmill.pipeline.runners import RUNNERS
    from gristmill.pipeline.workdir import WorkDir

    if kind == "ray":
        request.getfixturevalue("ray_session")  # the session's Ray: start() uses it as it is
    wd = WorkDir(str(tmp_path / "work"))
    with RUNNERS[kind].start(RunnerConfig(kind=kind, num_cpus=1), wd) as runner:
        with pytest.raises(TaskError, match="the object store went away"):
            runner.run("step", [{"name": "t00"}], _fails_with_an_upload_left_open())
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err[-3000:]
    with open(wd.log("step", "t00")) as f:
        log = f.read()
    assert "ignored while closing a file of an object store: ConnectionError: the object store went away" in log, log


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


# -- Ray's own messages to the driver: in the run dir's log, one line of gristmill's on the terminal ---
@pytest.mark.slow
def test_rays_messages_to_the_driver_go_to_the_run_dirs_log_not_the_terminal(ray_session, tmp_path, capfd, caplog):
    """What a lost node pushes to every driver (log_to_driver=False does not cover it): the raylet's
    death with the last 20 lines of its log. The terminal gets one line; the run dir's log all of it."""
    import time

    from ray._private.utils import publish_error_to_driver
    from ray._private.worker import global_worker

    from gristmill.pipeline.config import RunnerConfig
    from gristmill.pipeline.runners.ray import RayRunner
    from gristmill.pipeline.workdir import WorkDir

    marker = uuid.uuid4().hex
    message = ("Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL by the user "
               "or system OOM killer. Last 20 lines of the Raylet logs:\n"
               + "".join(f"    [state-dump] line {i} {marker}\n" for i in range(20)))
    wd = WorkDir(str(tmp_path / "work"))
    path = wd.log("ray", "driver")
    with RayRunner.start(RunnerConfig(kind="ray"), wd):
        for _ in range(2):  # each of the node's agents sends it: one line on the terminal for both
            publish_error_to_driver("raylet_died", message, gcs_client=global_worker.gcs_client)
        deadline = time.monotonic() + 20  # the driver's listener thread polls for them
        while time.monotonic() < deadline and _read(path).count(marker) < 40:
            time.sleep(0.1)
    out, err = capfd.readouterr()
    assert marker not in out + err and "(raylet)" not in out + err, (out + err)[-3000:]
    assert _read(path).count(marker) == 40
    shown = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Ray: ")]
    assert shown == [f"Ray: Raylet is terminated. Termination is unexpected. (Ray's whole message: {path})"], shown


def test_a_ray_message_the_run_dirs_log_cannot_take_is_printed_as_ray_prints_it(tmp_path, caplog):
    """Nothing lost: where the log cannot be written (here a folder in its place), Ray's printer gets the
    message; a worker's own output (not Ray's message) always goes to Ray's printer."""
    from gristmill.pipeline.runners.ray_messages import DriverMessages
    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir(str(tmp_path / "work"))
    printed = []
    messages = DriverMessages(wd, lambda data, ignore_prefix: printed.append(data["lines"]))
    messages({"pid": 4242, "lines": ["a worker's print"]})
    os.makedirs(wd.log("ray", "driver"))
    messages({"pid": "raylet", "lines": ["Raylet is terminated. Termination is unexpected. Last 20 lines: x"]})
    assert printed == [["a worker's print"], ["Raylet is terminated. Termination is unexpected. Last 20 lines: x"]]
    assert not [r for r in caplog.records if r.getMessage().startswith("Ray: ")]  # no line naming a log that is not there
