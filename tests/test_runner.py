"""The task runners: markers, task logs, a failing task's one-line error, and Ray retrying a
task whose worker died (a retried task is idempotent: the marker stays the commit)."""
import os
import warnings

import pytest

from gristmill.pipeline.runner import SerialRunner, TaskError
from gristmill.pipeline.runners.ray import RayRunner
from gristmill.pipeline.workdir import WorkDir


def _flaky(item):
    warnings.warn(f"odd record in {item['name']}")
    if item["part"] == 1:
        raise ValueError("bad byte at offset 7")
    return {"documents_in": 1}


def test_a_failing_task_names_its_step_partition_inputs_and_log(tmp_path):
    wd = WorkDir(str(tmp_path))
    runner = SerialRunner(wd, inputs={0: ["/in/a.jsonl"], 1: ["/in/b.jsonl", "/in/c.jsonl"]})
    items = [{"name": f"part-{p:05d}", "part": p} for p in range(3)]
    log = wd.log("extract", "part-00001")
    with pytest.raises(TaskError) as e:
        runner.run("extract", items, _flaky)
    assert str(e.value) == (f"extract: task part-00001 (partition 1: /in/b.jsonl, /in/c.jsonl) failed: "
                            f"ValueError: bad byte at offset 7; its log: {log}")
    text = open(log).read()
    assert "odd record in part-00001" in text and "Traceback" in text and "bad byte at offset 7" in text
    assert "odd record in part-00000" in open(wd.log("extract", "part-00000")).read()  # warnings go to the task's log
    assert wd.done("extract", "part-00000") is not None and wd.done("extract", "part-00001") is None


def test_a_task_without_warnings_writes_no_log(tmp_path):
    wd = WorkDir(str(tmp_path))
    assert SerialRunner(wd).run("s", [{"name": "a"}], lambda it: {}) == [wd.done("s", "a")]
    assert not os.path.exists(wd.log("s", "a")) and os.listdir(wd.logs("s")) == ["a.attempt-1"]


@pytest.mark.slow
def test_ray_retries_a_task_whose_worker_died_and_counts_it(ray_session, tmp_path):
    import functools

    def _dies_once(item, flag_dir):  # defined here: pickled by value (workers cannot import tests/)
        flag = os.path.join(flag_dir, item["name"])
        if item["name"] == "t3" and not os.path.exists(flag):
            open(flag, "w").close()
            os._exit(1)  # the worker process dies mid-task, as under the OOM killer
        return {"documents_in": int(item["name"][1:])}

    wd = WorkDir(str(tmp_path / "w"))
    os.makedirs(tmp_path / "flags")
    runner = RayRunner(ray_session, wd, max_retries=3)
    items = [{"name": f"t{i}"} for i in range(6)]
    out = runner.run("step", items, functools.partial(_dies_once, flag_dir=str(tmp_path / "flags")))
    assert [s["documents_in"] for s in out] == list(range(6))
    assert runner.retries == {"step": 1}
    with pytest.raises(TaskError, match=r"^step2: task t3 failed: its worker died in each of its 1 attempt \(runner.max_retries: 0; "):
        os.remove(tmp_path / "flags" / "t3")
        RayRunner(ray_session, wd, max_retries=0).run("step2", items, functools.partial(
            _dies_once, flag_dir=str(tmp_path / "flags")))


def _counted(item, calls):
    calls.append(item["name"])
    if item.get("fail"):
        raise ValueError("bad")
    return {"documents_in": int(item["name"][1:])}


def test_a_batch_commits_with_one_marker_that_a_rerun_in_other_batches_finds(tmp_path):
    import functools

    from gristmill.pipeline.runner import run_batch

    wd, calls = WorkDir(str(tmp_path)), []
    fn = functools.partial(_counted, calls=calls)
    items = [{"name": f"t{i}"} for i in range(10)]
    for lo in range(0, 10, 4):  # batches of 4, 4 and 2: three markers for ten tasks
        run_batch(fn, items[lo:lo + 4], wd, "step")
    assert sorted(os.listdir(tmp_path / "_done" / "step")) == ["t0.batch.json", "t4.batch.json", "t8.batch.json"]
    # the batch of t4-t7 killed before its marker: a rerun (here serial, one batch) redoes those four only
    os.remove(wd.batch_marker("step", "t4"))
    calls.clear()
    again = SerialRunner(wd)
    out = again.run("step", items, fn)
    assert [s["documents_in"] for s in out] == list(range(10))
    assert calls == ["t4", "t5", "t6", "t7"] and again.resumed_tasks == 6


def test_a_batch_whose_item_raises_commits_the_items_before_it(tmp_path):
    import functools

    from gristmill.pipeline.runner import TaskFailed, run_batch

    wd, calls = WorkDir(str(tmp_path)), []
    items = [{"name": "t0"}, {"name": "t1"}, {"name": "t2", "fail": True}, {"name": "t3"}]
    with pytest.raises(TaskFailed):
        run_batch(functools.partial(_counted, calls=calls), items, wd, "step")
    assert set(wd.finished("step")) == {"t0", "t1"} and calls == ["t0", "t1", "t2"]


def test_a_retried_batch_skips_what_a_marker_lists(tmp_path):
    import functools

    from gristmill.pipeline.runner import run_batch

    wd, calls = WorkDir(str(tmp_path)), []
    fn = functools.partial(_counted, calls=calls)
    items = [{"name": f"t{i}"} for i in range(4)]
    run_batch(fn, items[:2], wd, "step")  # an earlier, smaller batch committed t0 and t1
    os.rename(wd.attempt("step", "t0", 1), wd.attempt("step", "t2", 1))  # this batch's first attempt died
    calls.clear()
    out = run_batch(fn, items[2:] + items[:2], wd, "step")  # its retry (attempt 2) starts at t2
    assert [s["documents_in"] for s in out] == [2, 3, 0, 1] and calls == ["t2", "t3"]
