"""`gristmill train` fed by `gristmill serve` (issue 31): 2 ranks under torchrun on gloo log the same
loss curve, bitwise, as the same run fed in-process; interrupted and resumed through the service,
still the same. Two servers run in their own processes on 127.0.0.1 (helpers.ServeProcess); the
runs are tests/test_trainer.py's (its ``train`` launcher and its learnable tiny dataset)."""
from __future__ import annotations

import os

import pytest

from helpers import ServeProcess
from test_trainer import STEPS, build_learnable, meta, records, samples, train

from gristmill.loader import Caching, Loader

pytestmark = pytest.mark.slow  # four 2-rank torchrun launches with torch (~1 min on 2 cores)

W = 2
STOP = 5  # the interrupted run stops after this step (between the step-4 and step-8 checkpoints)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The learnable dataset, its manifest sha256 and two servers of its store."""
    root = tmp_path_factory.mktemp("served-train")
    url = build_learnable(str(root))
    with Loader(url, caching=Caching(dir=str(root / "probe"))) as ld:
        sha = ld.manifest.sha256
    servers = [ServeProcess(os.path.dirname(url), args=("--cache-dir", str(root / f"cache-{i}"))) for i in range(2)]
    yield {"url": url, "sha": sha, "service": f"data.service=[{servers[0].url}, {servers[1].url}]"}
    for s in servers:
        s.kill()


def curve(run_dir: str, kind: str = "train", key: str = "loss") -> list[tuple[int, str]]:
    """(step, value as float.hex) of each logged step: equal lists are bitwise-equal curves."""
    return [(step, float.hex(r[key])) for step, r in sorted(records(run_dir, kind).items())]


def test_a_served_two_rank_run_has_the_in_process_loss_curve_bitwise_and_resumes(served, tmp_path):
    ref = str(tmp_path / "in-process")
    train(served["url"], ref, nproc=W)
    want = curve(ref)
    assert [s for s, _ in want] == list(range(1, STEPS + 1))

    # the same run, its batches from the service, its data named by hash only
    full = str(tmp_path / "served")
    train(served["sha"], full, served["service"], nproc=W)
    assert not os.path.exists(f"{full}-cache")  # served: the trainer kept no shard cache
    assert curve(full) == want
    assert curve(full, "eval", "val_loss") == curve(ref, "eval", "val_loss")  # validation is served too
    assert samples(full) == samples(ref)

    # interrupted after STEP, resumed to STEPS, both halves through the service
    part = str(tmp_path / "resumed")
    train(served["sha"], part, served["service"], nproc=W, extra=["--stop-after-step", str(STOP)])
    assert sorted(os.listdir(os.path.join(part, "checkpoints"))) == ["step-4", f"step-{STOP}"]
    assert curve(part) == want[:STOP]
    out = train(served["sha"], part, served["service"], nproc=W)
    assert f"step-{STOP}" in out.stderr and "resumed from" in out.stderr
    assert curve(part) == want
    assert samples(part) == samples(ref)
    m = meta(part, STEPS)
    assert m["resumed_from"].endswith(f"step-{STOP}") and m["world_size"] == W
    assert m["data"]["manifest_sha256"] == meta(ref, STEPS)["data"]["manifest_sha256"] == served["sha"]
