"""Every registered runner (``pipeline.runners.RUNNERS``) keeps the same contract: results in
item order with their stats, the marker as the commit, a rerun that skips every committed task
and redoes only the rest, a task's exception as one TaskError, a batch whose worker died run
again where the runner promises it (``retries_lost_workers``), and the same outputs as any other
runner. A new runner passes this module by being registered."""
import os
import signal

import pytest

from gristmill.pipeline.config import RunnerConfig
from gristmill.pipeline.runner import TaskError
from gristmill.pipeline.runners import RUNNERS
from gristmill.pipeline.workdir import WorkDir

KINDS = [pytest.param(k, marks=pytest.mark.slow) if k == "ray" else k for k in RUNNERS]


@pytest.fixture
def start(request, tmp_path):
    """``start(kind, **runner_keys)``: the runner of that kind over a fresh work dir, as a prepare starts it."""
    def _start(kind, **keys):
        if kind == "ray":
            request.getfixturevalue("ray_session")  # the session's Ray: start() uses it as it is
        keys = {k: v for k, v in {"num_cpus": 2, **keys}.items() if k in RUNNERS[kind].options}
        return RUNNERS[kind].start(RunnerConfig(kind=kind, **keys), WorkDir(str(tmp_path / kind)))
    return _start


def _tasks(out_dir: str, calls_dir: str):
    """A step function (a closure: it travels by value to any worker, Ray's included) that writes
    one output file per item, notes each call, and returns stats that depend on the item only."""
    def task(item):
        open(os.path.join(calls_dir, f"{item['name']}.{os.getpid()}.{len(os.listdir(calls_dir))}"), "w").close()
        if item.get("fail"):
            raise ValueError(f"bad byte in {item['name']}")
        with open(os.path.join(out_dir, item["name"]), "w") as f:
            f.write(str(item["i"] ** 2))
        return {"value": item["i"] ** 2, "documents_in": item["i"]}
    return task


def _dirs(tmp_path, kind):
    out, calls = tmp_path / f"out-{kind}", tmp_path / f"calls-{kind}"
    out.mkdir(exist_ok=True), calls.mkdir(exist_ok=True)
    return str(out), str(calls)


def _run_step(start, kind, tmp_path):
    """The 12 items' step on a fresh runner of ``kind``: (stats, work dir, output dir, calls dir)."""
    out, calls = _dirs(tmp_path, kind)
    with start(kind) as runner:
        return runner.run("step", ITEMS, _tasks(out, calls)), runner.wd, out, calls


def _plain(stats: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if not k.startswith("_")} for s in stats]


def _calls(calls_dir: str) -> list[str]:
    return sorted(n.split(".")[0] for n in os.listdir(calls_dir))


ITEMS = [{"name": f"t{i:02d}", "i": i} for i in range(12)]


def test_every_runner_kind_is_a_config_choice():
    from gristmill.pipeline.runners import KINDS as CHOICES

    assert CHOICES == ("auto", *RUNNERS) and all(cls.kind == k for k, cls in RUNNERS.items())
    assert all(set(cls.options) <= set(RunnerConfig.model_fields) - {"kind"} for cls in RUNNERS.values())


@pytest.mark.parametrize("kind", KINDS)
def test_results_stats_and_markers(kind, start, tmp_path):
    got, wd, out, calls = _run_step(start, kind, tmp_path)
    assert [s["value"] for s in got] == [i ** 2 for i in range(12)]  # item order
    assert all(s["_seconds"] >= 0 and "_cpu_seconds" in s for s in got)
    assert sorted(wd.finished("step")) == [it["name"] for it in ITEMS]  # every task committed by a marker
    assert {n: open(os.path.join(out, n)).read() for n in os.listdir(out)} == {it["name"]: str(it["i"] ** 2) for it in ITEMS}
    assert _calls(calls) == [it["name"] for it in ITEMS]  # each once


@pytest.mark.parametrize("kind", KINDS)
def test_a_rerun_skips_committed_tasks_and_redoes_the_rest(kind, start, tmp_path):
    first, wd, out, calls = _run_step(start, kind, tmp_path)
    _forget(wd, "step", "t05")
    for n in os.listdir(calls):
        os.remove(os.path.join(calls, n))
    with start(kind) as runner:
        again = runner.run("step", ITEMS, _tasks(out, calls))
        assert runner.resumed_tasks == len(ITEMS) - 1
    assert _calls(calls) == ["t05"]
    assert _plain(again) == _plain(first)


def _forget(wd, step, name):
    """Uncommit one task, as a kill before its marker: its own marker, or its entry in its batch's."""
    import json

    if os.path.exists(wd.marker(step, name)):
        os.remove(wd.marker(step, name))
        return
    d = os.path.dirname(wd.marker(step, name))
    for f in os.listdir(d):
        path = os.path.join(d, f)
        tasks = json.load(open(path))["tasks"] if f.endswith(".batch.json") else {}
        if name in tasks:
            os.remove(path)
            if kept := {k: v for k, v in tasks.items() if k != name}:
                wd.mark_batch_done(step, kept)
            return
    raise AssertionError(f"no marker holds {name}")


@pytest.mark.parametrize("kind", KINDS)
def test_a_tasks_exception_is_one_task_error(kind, start, tmp_path):
    out, calls = _dirs(tmp_path, kind)
    items = [{**it, "part": it["i"], "fail": it["i"] == 3} for it in ITEMS[:6]]
    with start(kind, max_retries=2) as runner:
        with pytest.raises(TaskError, match=r"^step: task t03 \(partition 3\) failed: ValueError: bad byte in t03; its log: "):
            runner.run("step", items, _tasks(out, calls))
        assert runner.wd.done("step", "t03") is None
    assert _calls(calls).count("t03") == 1  # an exception is not retried


def _dies_once(flags: str):
    def task(item):
        flag = os.path.join(flags, item["name"])
        if item["name"] == "t03" and not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-task, as under the OOM killer
        return {"value": item["i"]}
    return task


@pytest.mark.slow
@pytest.mark.parametrize("kind", [k for k, cls in RUNNERS.items() if cls.retries_lost_workers])
def test_a_batch_whose_worker_died_is_run_again_and_counted(kind, start, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    with start(kind, max_retries=3) as runner:
        got = runner.run("step", ITEMS[:6], _dies_once(str(flags)))
        assert runner.retries.get("step", 0) >= 1
    assert [s["value"] for s in got] == list(range(6))


def test_every_runner_gives_the_same_outputs(start, tmp_path):
    """The outputs do not depend on the runner: the in-process reference against the local pool
    (Ray's are compared in the slow tests above and in test_local_runner's manifest test)."""
    outputs = {}
    for kind in ("serial", "local"):
        stats, _, out, _ = _run_step(start, kind, tmp_path)
        outputs[kind] = (_plain(stats), {n: open(os.path.join(out, n)).read() for n in sorted(os.listdir(out))})
    assert outputs["serial"] == outputs["local"]
