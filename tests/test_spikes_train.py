"""A planted poison (rows of one repeated token) spikes the tiny model's loss on CPU; with
``spikes.action: rewind_skip`` the run rewinds to the checkpoint before it, skips the spike's
window, continues, and the audit stays exact: `audit steps` names the poison, `audit seen` never
counts the skipped samples, and a resume at world size 2 trains the samples the skip left next."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gristmill.audit import audit_seen, consumed, open_manifest, parse_steps, read_checkpoint
from gristmill.audit.steps import audit_steps
from gristmill.loader.order import samples_at
from gristmill.manifests.synthetic import build_synthetic

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "configs", "train-tiny.yaml")
B, SPIKE_STEP, POISON_TOKEN = 8, 18, 7
SHAPE = dict(dataset="count", vocab_size=64, shard_rows=(64,) * 4, val_rows=(16,), tokens="counting")


def train(manifest, run_dir, steps, *sets, nproc=1):
    launcher = [sys.executable, "-m", "gristmill.trainer"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "gristmill.trainer"]
    args = [f"data.manifest={manifest}", f"run.dir={run_dir}", f"data.cache_dir={run_dir}-cache", f"run.steps={steps}",
            "checkpoint.every=4", "eval.every=0", "run.tensorboard=false", "run.log_samples=true",
            "spikes.action=rewind_skip", "spikes.warmup_steps=8", "spikes.ema_steps=5", *sets]
    proc = subprocess.run(launcher + [JOB] + [a for s in args for a in ("--set", s)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc


def records(run_dir, kind):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """The counting dataset with every row of step 18's batch replaced by one token repeated; the
    rows are found through the loader's order on the same shapes (content does not move them)."""
    root = str(tmp_path_factory.mktemp("poison"))
    plain = build_synthetic(os.path.join(root, "plain"), publish=False, **SHAPE)
    shard, row = samples_at(plain.manifest, "train", 0, "global", np.arange((SPIKE_STEP - 1) * B, SPIKE_STEP * B))
    rows = tuple((int(s), int(r), POISON_TOKEN) for s, r in zip(shard, row))
    return build_synthetic(os.path.join(root, "data"), poison=rows, **SHAPE), {f"doc-{s}-{r}" for s, r, _ in rows}


def test_spike_rewinds_skips_and_the_audit_stays_exact(poisoned, tmp_path):
    published, poison_docs = poisoned
    run = str(tmp_path / "run")
    train(published.url, run, 20)
    spikes, rewinds = records(run, "spike"), records(run, "rewind")
    assert [(s["step"], s["metric"], s["action"]) for s in spikes] == [(SPIKE_STEP, "loss", "rewind_skip")]
    assert [(r["to_step"], r["skip_start"], r["skip_end"]) for r in rewinds] == [(16, 16 * B, SPIKE_STEP * B)]
    train_steps = [r["step"] for r in records(run, "train")]
    assert train_steps == list(range(1, 19)) + [17, 18, 19, 20]  # 17-18 again, on the samples after the skip

    ckpt = read_checkpoint(run)
    assert ckpt.step == 20 and ckpt.next_index == 20 * B + 2 * B
    assert [(s["kind"], s["start"], s["end"], s["step"], s["after_step"]) for s in ckpt.skips] == \
        [("rewind", 128, 144, SPIKE_STEP, 16)]
    used = consumed(published.manifest, ckpt)
    assert not np.isin(used.index, np.arange(128, 144)).any() and len(used) == 20 * B
    seen = set(audit_seen(published, used, parse_steps(None, ckpt)).documents.column("doc_id").to_pylist())
    assert not seen & poison_docs  # the poison was skipped: never seen by the model that continued

    window = audit_steps(open_manifest(ckpt), ckpt, (17, 18))
    docs = {d["doc_id"]: d for d in window.documents.to_pylist()}
    assert poison_docs <= set(docs)
    assert all(docs[d]["samples_skipped"] == 1 and "loss spike" in docs[d]["skipped"][0] for d in poison_docs)
    losses = window.summary["losses"]
    assert [(e["step"], e["rewound"]) for e in losses] == [(17, True), (18, True), (17, False), (18, False)]
    assert losses[1]["loss"] > losses[3]["loss"] + 1  # the spike, then the same step on other data

    # The run report's spike section lists the window's documents, the poison flagged as skipped.
    from gristmill.report.training import run_page

    section = next(s for s in run_page(run).sections if s.id == "spikes")
    rows = [row for item in section.items if hasattr(item, "rows") and "document" in item.headers for row in item.rows]
    assert {row[0] for row in rows if row[-1]} >= poison_docs

    # The trainer's own record of the indices it read agrees (samples.jsonl, later lines win).
    logged = {}
    with open(os.path.join(run, "samples.jsonl")) as f:
        for r in map(json.loads, f):
            logged[r["step"]] = r["indices"]
    assert sorted(i for s in range(1, 21) for i in logged[s]) == sorted(used.index.tolist())

    # Resume at world size 2 after the skip: steps 21-24 read the samples right after it.
    train(published.url, run, 24, nproc=2)
    with open(os.path.join(run, "samples.jsonl")) as f:
        for r in map(json.loads, f):
            logged[r["step"]] = r["indices"]
    for step in range(21, 25):
        assert sorted(logged[step]) == list(range((step - 1) * B + 2 * B, step * B + 2 * B))
    final = read_checkpoint(run)
    assert final.skips == ckpt.skips and final.world_size == 2
    assert consumed(published.manifest, final, (21, 24)).index.tolist() == list(range(21 * B - B + 16, 24 * B + 16))
