"""The pieces of a reliable restart, in one process: the watchdog (trainer/watchdog.py), the
restart round's store namespace (trainer/rendezvous.py) and the straggler rule (rank_stats.py).
The end-to-end runs under torchrun are tests/test_trainer_ranks.py."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from gristmill.trainer.errors import TrainingError
from gristmill.trainer.rank_stats import StragglerRule
from gristmill.trainer.rendezvous import round_store
from gristmill.trainer.watchdog import Watchdog, group_timeout_s


def test_the_watchdog_names_the_phase_dumps_the_stacks_and_ends_a_hung_step(capfd):
    fired = []
    with Watchdog(0.3, rank=3, on_expiry=fired.append) as dog:
        dog.arm(7, "training step")
        time.sleep(0.3 * 0.5)
        dog.arm(8, "training step")  # a new step re-arms: step 7 never expires
        deadline = time.monotonic() + 5
        while not fired and time.monotonic() < deadline:
            time.sleep(0.02)
    assert fired == ["training step (step 8)"]
    err = capfd.readouterr().err
    assert "gristmill watchdog: rank 3 on host" in err and "training step (step 8) still running" in err
    assert "test_trainer_restart_units.py" in err  # every thread's stack, this test's included


def test_a_disarmed_or_disabled_watchdog_never_fires():
    fired = []
    with Watchdog(0.2, rank=0, on_expiry=fired.append) as dog:
        dog.arm(1, "training step")
        dog.disarm()
        time.sleep(0.5)
    with Watchdog(0, rank=0, on_expiry=fired.append) as off:
        off.arm(1, "training step")
        time.sleep(0.2)
    assert fired == []
    assert group_timeout_s(0) == 0 and group_timeout_s(60) > 60  # the group's timeout: the watchdog speaks first


def test_a_restarted_round_agrees_on_a_fresh_namespace_even_when_a_follower_reads_the_dead_leader():
    """Two rounds of three ranks on one store (torchrun keeps its store across restarts). In the
    second, the followers start first and meet the first round's leader; they must still end in
    the second rank 0's namespace, which holds none of the first round's keys."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for order in ([0, 1, 2], [2, 1, 0]):
        found: dict[int, bool] = {}

        def rank_main(rank: int) -> None:
            client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                                   timeout=timedelta(seconds=20))
            store = round_store(client, rank, 3, timedelta(seconds=20))
            fresh = not store.check([f"rank-{r}" for r in range(3)])  # nothing of an earlier round
            store.set(f"rank-{rank}", "here")
            store.wait([f"rank-{r}" for r in range(3)], timedelta(seconds=10))  # all three in one namespace
            found[rank] = fresh

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in order]
        for t in threads:
            t.start()
            time.sleep(0.3)  # round 2: rank 0 starts last, after its followers read the old leader
        for t in threads:
            t.join(timeout=30)
        assert found == {0: True, 1: True, 2: True}
    assert server.add("gristmill/tickets", 0) == 6  # six processes, six tickets: none reused


def test_a_round_whose_rank_0_never_comes_fails_within_the_timeout():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    server.set("gristmill/leader", "999")  # a dead round's leader, no rank 0 alive
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match="rank 1 heard no rank 0 of this round within run.hang_timeout_s"):
        round_store(client, 1, 2, timedelta(seconds=2))
    assert time.monotonic() - t0 < 10


def test_the_straggler_rule_names_a_rank_slower_than_the_median_for_several_windows():
    rule = StragglerRule(0.2, 2, ["a", "b", "c"])
    window = {"rank_step_s": [1.0, 1.0, 1.0], "rank_collective_wait_s": [0.5, 0.5, 0.0],
              "rank_input_wait_s": [0.0, 0.0, 0.5]}
    assert rule.update(window) == []  # one window: not yet
    found = rule.update(window)
    assert [(s["rank"], s["host"], s["windows"]) for s in found] == [(2, "c", 2)]
    assert s_close(found[0]["own_step_s"], 1.0) and s_close(found[0]["median_own_step_s"], 0.5)
    even = {"rank_step_s": [1.0] * 3, "rank_collective_wait_s": [0.0] * 3, "rank_input_wait_s": [0.0] * 3}
    assert rule.update(even) == [] and rule.update(window) == []  # the streak starts again


def s_close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9


@pytest.mark.parametrize("end, want", [(None, ["barrier", "destroy"]), ("interrupted", ["barrier", "destroy"]),
                                       ("error", ["destroy"])])
def test_the_ranks_leave_together_after_a_run_they_all_ended(monkeypatch, tmp_path, end, want):
    """`gristmill train` ends the process group with every rank at once (a barrier, then destroy) when
    the run ended alike on every rank (done, or a stop agreed at a record): gloo's threads outlive
    destroy_process_group, and a rank leaving while its peer is still inside gloo aborted now and then
    (issue 40). After an error a peer may be gone: no barrier, which would wait for it."""
    import signal

    import gristmill.trainer.train
    from gristmill.cli.train import main
    from gristmill.trainer.errors import Interrupted

    calls = []

    def fake_train(cfg, **kw):
        calls.append("train")
        if end == "interrupted":
            raise Interrupted(signal.SIGTERM, 3, None)
        if end == "error":
            raise TrainingError("the loader ran out of training data at step 3")

    monkeypatch.setattr(gristmill.trainer.train, "train", fake_train)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: calls.append("destroy"))
    rc = main(["configs/train-tiny.yaml", "--set", f"run.dir={tmp_path}"])
    assert calls == ["train", *want]
    assert rc == {None: 0, "interrupted": 128 + signal.SIGTERM}[end] if end != "error" else rc != 0
