"""LocalRunner: the pool of worker processes a prepare without a cluster runs its tasks on.
Results in item order, resume by markers, a worker killed mid-task retried and counted, an item's
exception one TaskError (not retried), workers that die with the driver, and the same manifest
as under Ray."""
import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gristmill.pipeline.runner import TaskError
from gristmill.pipeline.runners.local import LocalRunner
from gristmill.pipeline.workdir import WorkDir


def _slow_square(item):  # module level: pickled by reference, imported by the workers
    time.sleep(0.01 * (5 - item["i"] % 5))  # later items finish first
    return {"value": item["i"] ** 2, "pid": os.getpid()}


def _logged(item, calls):
    open(os.path.join(calls, item["name"]), "w").close()
    return {"value": item["i"]}


def _dies_once(item, flags):
    flag = os.path.join(flags, item["name"])
    if item["name"] == "t3" and not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-task, as under the OOM killer
    return {"value": int(item["name"][1:])}


def _fails(item):
    if item["i"] == 2:
        raise ValueError("bad byte at offset 7")
    return {"value": item["i"]}


def test_results_in_item_order_from_several_workers(tmp_path):
    wd = WorkDir(str(tmp_path / "w"))
    runner = LocalRunner(wd, num_workers=2, max_in_flight=4)
    try:
        items = [{"name": f"t{i:02d}", "i": i} for i in range(20)]
        out = runner.run("step", items, _slow_square)
    finally:
        runner.close()
    assert [s["value"] for s in out] == [i * i for i in range(20)]
    assert len({s["pid"] for s in out}) == 2 and os.getpid() not in {s["pid"] for s in out}
    assert [wd.done("step", it["name"])["value"] for it in items] == [i * i for i in range(20)]
    assert runner.retries == {}


def test_a_closure_runs_by_value(tmp_path):
    wd = WorkDir(str(tmp_path / "w"))
    offset = 7
    runner = LocalRunner(wd, num_workers=1)
    try:
        out = runner.run("step", [{"name": f"t{i}", "i": i} for i in range(3)], lambda it: {"value": it["i"] + offset})
    finally:
        runner.close()
    assert [s["value"] for s in out] == [7, 8, 9]


def test_resume_skips_marked_items(tmp_path):
    wd = WorkDir(str(tmp_path / "w"))
    calls = tmp_path / "calls"
    calls.mkdir()
    items = [{"name": f"t{i}", "i": i} for i in range(6)]
    for it in items[:4:2]:  # t0 and t2 were committed by an earlier run
        wd.mark_done("step", it["name"], {"value": -1})
    runner = LocalRunner(wd, num_workers=2)
    try:
        out = runner.run("step", items, functools.partial(_logged, calls=str(calls)))
    finally:
        runner.close()
    assert sorted(os.listdir(calls)) == ["t1", "t3", "t4", "t5"]
    assert [s["value"] for s in out] == [-1, 1, -1, 3, 4, 5] and runner.resumed_tasks == 2


def test_a_worker_killed_mid_task_is_retried_and_counted(tmp_path):
    wd = WorkDir(str(tmp_path / "w"))
    flags = tmp_path / "flags"
    flags.mkdir()
    items = [{"name": f"t{i}"} for i in range(6)]
    runner = LocalRunner(wd, num_workers=1, max_retries=3)
    try:
        out = runner.run("step", items, functools.partial(_dies_once, flags=str(flags)))
    finally:
        runner.close()
    assert [s["value"] for s in out] == list(range(6))
    assert runner.retries == {"step": 1} and os.path.exists(wd.attempt("step", "t3", 2))
    # with no retries allowed the same death is the step's one-line error, naming the task
    os.remove(flags / "t3")
    runner = LocalRunner(wd, num_workers=1, max_retries=0)
    with pytest.raises(TaskError, match=r"^step2: task t3 failed: its worker died in each of its 1 attempt "
                                        r"\(runner.max_retries: 0; BrokenProcessPool"):
        runner.run("step2", items, functools.partial(_dies_once, flags=str(flags)))
    runner.close()


def _still_alive(pids: list[int], timeout: float) -> list[int]:
    """Those of ``pids`` not yet dead (a zombie, or gone and reaped: /proc) after ``timeout`` s."""

    def dead(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + timeout
    alive = [pid for pid in pids if not dead(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [pid for pid in alive if not dead(pid)]
    return alive


def test_a_worker_killed_between_steps_costs_nothing(tmp_path):
    wd = WorkDir(str(tmp_path / "w"))
    runner = LocalRunner(wd, num_workers=1)
    try:
        (first,) = runner.run("one", [{"name": "t0", "i": 0}], _slow_square)
        os.kill(first["pid"], signal.SIGKILL)  # the idle worker, as the OOM killer might
        assert not _still_alive([first["pid"]], timeout=10), "the killed worker did not die"  # the pool reaps it
        (second,) = runner.run("two", [{"name": "t1", "i": 1}], _slow_square)
    finally:
        runner.close()
    assert second["value"] == 1 and second["pid"] != first["pid"] and runner.retries == {}


def test_an_items_exception_is_one_task_error_not_retried(tmp_path):
    wd = WorkDir(str(tmp_path / "w"))
    runner = LocalRunner(wd, num_workers=2, inputs={2: ["/in/b.jsonl"]})
    items = [{"name": f"part-{i}", "i": i, "part": i} for i in range(4)]
    with pytest.raises(TaskError) as e:
        runner.run("extract", items, _fails)
    log = wd.log("extract", "part-2")
    assert str(e.value) == (f"extract: task part-2 (partition 2: /in/b.jsonl) failed: ValueError: bad byte at offset 7; "
                            f"its log: {log}")
    assert "Traceback" in open(log).read()
    assert not os.path.exists(wd.attempt("extract", "part-2", 2)) and runner.retries == {}
    runner.close()


def test_an_attempt_file_a_killed_worker_was_creating_is_no_retry(tmp_path):
    """A worker killed between writing an attempt file's temp and linking it into place (the driver's
    kill after another task failed, or the OOM killer) leaves ``<name>.attempt-1.tmp-…``: the retry
    count reads attempt numbers, so it is not a retry (it read as one, and a CI run failed on it)."""
    wd = WorkDir(str(tmp_path / "w"))
    os.makedirs(wd.logs("step"))
    open(wd.attempt("step", "t9", 1) + ".tmp-0123456789ab", "w").close()
    runner = LocalRunner(wd, num_workers=1)
    try:
        runner.run("step", [{"name": f"t{i}", "i": i} for i in range(3)], _slow_square)
    finally:
        runner.close()
    assert runner.retries == {}
    assert WorkDir.attempt_of("t9.attempt-12") == ("t9", 12)
    assert [WorkDir.attempt_of(n) for n in ("t9.attempt-1.tmp-0123456789ab", "t9.log", ".attempt-2")] == [None] * 3


DRIVER = textwrap.dedent("""
    import os, sys, time
    from gristmill.pipeline.runners.local import LocalRunner
    from gristmill.pipeline.workdir import WorkDir

    def task(item):
        open(os.path.join(sys.argv[2], str(os.getpid())), "w").close()
        time.sleep(2)
        open(os.path.join(sys.argv[2], "late"), "w").close()  # never, if the worker died with the driver
        return {}

    if __name__ == "__main__":
        LocalRunner(WorkDir(sys.argv[1]), num_workers=2).run("step", [{"name": "a"}, {"name": "b"}], task)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_workers_die_with_the_driver(tmp_path):
    (tmp_path / "driver.py").write_text(DRIVER)
    seen = tmp_path / "seen"
    seen.mkdir()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "w"), str(seen)])
    deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
    while len(os.listdir(seen)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    workers = [int(p) for p in os.listdir(seen)]
    proc.kill()  # kill -9 of the driver alone: no signal reaches the workers from it
    proc.wait()
    # Each worker is dead (a zombie or gone) well before its task's 2 s sleep ends: it never
    # writes "late". A surviving one would still be sleeping at the deadline.
    alive = _still_alive(workers, timeout=1.5)
    assert not alive, f"workers {alive} outlived the driver"
    assert not (seen / "late").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="_still_alive reads the workers' state in /proc")
def test_ctrl_c_in_the_driver_kills_the_workers_mid_task(tmp_path):
    """Ctrl-C (SIGINT to the driver; the workers ignore it) kills the workers at once: none runs
    its task to the end. (They did: the kill read the pool's process list after shutdown had
    dropped it, and the driver's exit then waited for every running task.)"""
    from helpers import sigint_as_a_terminal_sends_it

    (tmp_path / "driver.py").write_text(DRIVER)
    seen = tmp_path / "seen"
    seen.mkdir()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "w"), str(seen)],
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_a_terminal_sends_it)
    deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
    while len(os.listdir(seen)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    workers = [int(p) for p in os.listdir(seen)]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "KeyboardInterrupt" in err, err[-2000:]
    # The driver has exited; a worker still running would write "late" when its 2 s sleep ends.
    alive = _still_alive(workers, timeout=3)
    assert not alive and not (seen / "late").exists(), f"workers {alive} ran on after Ctrl-C"


def test_the_runner_follows_runner_kind_and_the_cluster_address(monkeypatch):
    from pathlib import Path

    from helpers import demo_job_dict

    from gristmill.errors import ConfigError
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.runners import resolve

    def job(kind, **more):
        return PrepareConfig.from_dict(demo_job_dict(Path("/in"), Path("/out"), runner={"kind": kind, **more})).runner

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert [resolve(job(r)).kind for r in ("auto", "local", "ray", "serial")] == ["local", "local", "ray", "serial"]
    assert resolve(job("auto"), "ray://head:10001").kind == "ray"  # --address
    assert resolve(job("auto", address="ray://a:1"), "ray://b:2").address == "ray://b:2"  # --address overrides the job's
    assert resolve(job("ray", address="ray://a:1")).address == "ray://a:1"
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")  # what `ray job submit` sets
    assert resolve(job("auto")).kind == "ray"
    with pytest.raises(ConfigError, match=r"^runner.kind: local runs on this machine only, but a Ray cluster is named "
                                          r"\(RAY_ADDRESS=http://head:8265\); set runner.kind: auto"):
        resolve(job("local"))
    with pytest.raises(ConfigError, match=r"^runner.kind: expected one of auto, serial, local, ray, got 'cluster'$"):
        job("cluster")


@pytest.mark.slow
def test_local_and_embedded_ray_give_the_same_manifest(tmp_path, ray_session):
    from helpers import demo_job_dict

    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.demo_corpus import write_demo_corpus
    from gristmill.pipeline.executor import prepare

    write_demo_corpus(str(tmp_path / "demo"))
    hashes = {}
    for runner in ("local", "ray"):  # a partition per file: many tasks per step, several batches in flight
        job = demo_job_dict(tmp_path / "demo", tmp_path / runner, runner={"kind": runner, "num_cpus": 2}, partitioning={"partition_bytes": 1})
        hashes[runner] = prepare(PrepareConfig.from_dict(job), quiet=True).manifest_sha256
    assert hashes["local"] == hashes["ray"]
