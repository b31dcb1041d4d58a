"""The audit refuses checkpoints that would make it loop or lie (issue 26): a ``resumed_from`` chain
that cycles, and (for mixtures) documents of different components sharing an id."""
import os

import pytest
from helpers import write_checkpoint_meta

from gristmill.audit import CheckpointError, read_checkpoint
from gristmill.cli import main

B, W = 8, 2


def _gristmill(capsys, *args, timeout=60):
    """The CLI in this process, in a thread it waits for at most ``timeout`` s: a loop fails the
    test instead of hanging it. (returncode, stdout, stderr)."""
    import threading

    capsys.readouterr()
    result = []
    thread = threading.Thread(target=lambda: result.append(main(list(args))), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"gristmill {' '.join(args)} still running after {timeout} s: a loop?"
    out, err = capsys.readouterr()
    return result[0], out, err


@pytest.mark.parametrize("cycle", [["step-5"], ["step-5", "step-3"], ["step-5", "step-3", "step-2"]])
def test_a_resumed_from_cycle_is_refused_in_one_line_by_audit_and_report(tmp_path, toy_dataset, cycle, capsys):
    run = str(tmp_path / "run")
    ckpts = os.path.join(run, "checkpoints")
    # Each names the next as the one it resumed from; the last names the first: a loop.
    for name, prev in zip(cycle, cycle[1:] + cycle[:1]):
        write_checkpoint_meta(run, toy_dataset, step=int(name.split("-")[1]), global_batch=B, world_size=W,
                              resumed_from=os.path.join(ckpts, prev))
    newest = os.path.join(ckpts, "step-5")
    for args in (["audit", "seen", newest], ["audit", "doc", newest, "doc-0-0"]):
        rc, _, err = _gristmill(capsys, *args)
        assert rc == 2, err
        err = err.strip()
        assert "resumed_from names 'step-5'" in err and " -> ".join(cycle + ["step-5"]) in err and "\n" not in err
    _, out, err = _gristmill(capsys, "report", run, "--text")
    assert "resumed_from names 'step-5'" in out + err
    with pytest.raises(CheckpointError, match="resumed_from names 'step-5', not an earlier step-<N>"):
        read_checkpoint(newest)


def test_a_resumed_from_chain_that_does_not_go_back_or_names_no_step_is_refused(tmp_path, toy_dataset):
    run = str(tmp_path / "run")
    ckpts = os.path.join(run, "checkpoints")
    write_checkpoint_meta(run, toy_dataset, step=3, global_batch=B, world_size=W)
    write_checkpoint_meta(run, toy_dataset, step=5, global_batch=B, world_size=W, resumed_from=os.path.join(ckpts, "step-3"))
    assert read_checkpoint(os.path.join(ckpts, "step-5")).world_sizes == ((3, W), (5, W))  # a real chain still reads
    write_checkpoint_meta(run, toy_dataset, step=5, global_batch=B, world_size=W, resumed_from=os.path.join(run, ".."))
    with pytest.raises(CheckpointError, match=r"resumed_from names '\.\.', not an earlier step-<N>"):
        read_checkpoint(os.path.join(ckpts, "step-5"))
