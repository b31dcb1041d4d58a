"""Skipped samples (trainer/skips.py), the spike detector (trainer/spikes.py), and the audit honouring
skips, on meta.json written through trainer.meta and the real loader order (fast; the trained run
with a planted spike is tests/test_spikes_train.py)."""
import json
import os

import numpy as np
import pytest
from helpers import write_checkpoint_meta

from gristmill.audit import CheckpointError, audit_doc, audit_seen, consumed, parse_steps, read_checkpoint
from gristmill.audit.consumed import skipped
from gristmill.audit.steps import audit_steps
from gristmill.cli import main
from gristmill.loader.order import samples_at
from gristmill.trainer import skips
from gristmill.trainer.config import SpikesConfig
from gristmill.trainer.spikes import SpikeDetector

B, W = 8, 2
# A rewind at a spike in step 7 back to step-5, skipping 3 steps' samples [40, 64); a bad step 9 after it.
REWIND = skips.record("rewind", 40, 64, 7, "loss spike (z 9.0)", after_step=5)


def bad(step):  # the bad step's samples: its position after the rewind's shift of 24
    start = (step - 1) * B + 24
    return skips.record("bad_step", start, start + B, step, "non-finite loss or grad norm")


def test_step_indices_shift_after_a_rewind_and_drop_bad_steps():
    recs = [REWIND, bad(9)]
    index, step = skips.step_indices(5, 7, B, recs)
    assert index.tolist() == list(range(32, 40)) + list(range(64, 80))  # step 5 as before, 6 and 7 after the skip
    assert step.tolist() == [5] * 8 + [6] * 8 + [7] * 8
    assert skips.next_index(12, B, recs) == 12 * B + 24 and skips.next_index(4, B, recs) == 32
    assert skips.next_index(5, B, recs) == 64  # right after the rewind to step-5: past the skip
    idx, _ = skips.step_indices(9, 9, B, recs)
    assert skips.bad_step_mask(idx, recs).all()
    index, step, which = skips.skipped_samples(recs, B)
    assert index.tolist() == list(range(40, 64)) + list(range(88, 96))
    assert step.tolist() == [6] * 8 + [7] * 8 + [8] * 8 + [9] * 8  # a rewind's samples: the steps that would have read them
    assert skips.problem(recs, 12, B) is None


@pytest.mark.parametrize("rec, why", [
    ({**REWIND, "start": 48, "end": 72}, "starts at that checkpoint's next index 40"),
    ({**REWIND, "end": 60}, "multiple of the global batch"),
    ({**REWIND, "after_step": 7}, "after_step"),
    ({**REWIND, "kind": "oops"}, "kind rewind or bad_step"),
    ({**bad(9), "end": 95}, "one global batch"),
    ({**REWIND, "after_step": 5, "step": 13}, "later than this checkpoint's step 12"),
])
def test_malformed_skips_are_refused(rec, why):
    assert why in skips.problem([rec], 12, B)


@pytest.fixture
def run(tmp_path, toy_dataset):
    """12 steps after a rewind at step 7 to step-5 (24 samples skipped) and a bad step 9."""
    recs = [REWIND, bad(9)]
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), toy_dataset, step=12, skips=recs, job__data__micro_batch=2,
                                 loader__next_index=skips.next_index(12, B, recs))
    return toy_dataset, ckpt


def test_audit_never_counts_skipped_samples(run):
    published, ckpt_dir = run
    ckpt = read_checkpoint(ckpt_dir)
    used = consumed(published.manifest, ckpt)
    expected = [i for i in range(0, 12 * B + 24) if not (40 <= i < 64 or 88 <= i < 96)]
    assert used.index.tolist() == expected
    assert used.step.tolist() == [s for s in range(1, 13) if s != 9 for _ in range(B)]
    assert used.rank.tolist() == [(i % B) // (B // W) for i in expected]
    report = audit_seen(published, used, parse_steps(None, ckpt))
    assert report.summary["samples"] == 11 * B
    # A document only a skipped sample held: "skipped at step 7", not seen.
    shard, row = samples_at(published.manifest, "train", 3, "global", np.arange(40, 64))
    trained = set(zip(*samples_at(published.manifest, "train", 3, "global", np.array(expected))))
    only_skipped = next(f"doc-{s}-{r}" for s, r in zip(shard.tolist(), row.tolist()) if (s, r) not in trained)
    answer = audit_doc(published, ckpt, used, only_skipped, skipped(published.manifest, ckpt))
    assert not answer["seen"] and answer["occurrences"] == []
    assert [(o["skipped_at_step"], o["kind"]) for o in answer["skipped"]] == [(7, "rewind")]
    assert only_skipped not in set(report.documents.column("doc_id").to_pylist())


def test_audit_doc_cli_says_skipped_at_step(run, capsys):
    published, ckpt_dir = run
    shard, row = samples_at(published.manifest, "train", 3, "global", np.arange(88, 96))
    doc = f"doc-{shard[0]}-{row[0]}"
    main(["audit", "doc", ckpt_dir, doc])
    out = capsys.readouterr().out
    assert "skipped at step 9 (bad_step: non-finite loss or grad norm)" in out


def test_edited_next_index_with_skips_is_refused(tmp_path, toy_dataset):
    with pytest.raises(CheckpointError, match=r"\+ 24 skipped at rewinds = 120"):
        read_checkpoint(write_checkpoint_meta(str(tmp_path / "r"), toy_dataset, step=12, skips=[REWIND]))


def test_audit_steps_lists_the_window_with_skipped_samples_and_repeats(run, capsys):
    published, ckpt_dir = run
    ckpt = read_checkpoint(ckpt_dir)
    report = audit_steps(published, ckpt, (6, 7))
    s = report.summary
    assert s["samples_trained"] == 16 and s["samples_skipped"] == 16  # steps 6-7 trained [64, 80); would have read [40, 56)
    assert [r["kind"] for r in s["skips"]] == ["rewind"]
    docs = {d["doc_id"]: d for d in report.documents.to_pylist()}
    shard, row = samples_at(published.manifest, "train", 3, "global", np.r_[40:56, 64:80])
    assert set(docs) == {f"doc-{a}-{b}" for a, b in zip(shard.tolist(), row.tolist())}
    # seen before: samples of steps 1..5 holding the document (the toy has one document per row)
    before = samples_at(published.manifest, "train", 3, "global", np.arange(0, 40))
    for doc_id, d in docs.items():
        a, b = map(int, doc_id.split("-")[1:])
        assert d["seen_before"] == sum(1 for x, y in zip(*before) if (x, y) == (a, b))
        assert d["tokens"] == 17 and d["source"]
    skipped_docs = [d for d in docs.values() if d["samples_skipped"]]
    assert skipped_docs and all("rewind at step 7" in d["skipped"][0] for d in skipped_docs)
    t = report.samples.to_pydict()  # 2 ranks of 4 samples, micro-batches of 2; a rewind's samples: no rank trained them
    assert [(i, r, mb) for i, r, mb, ok in zip(t["index"], t["rank"], t["micro_batch"], t["trained"]) if ok] == \
        [(i, (i % 8) // 4, (i % 4) // 2) for i in range(64, 80)]
    assert {(r, mb) for r, mb, ok in zip(t["rank"], t["micro_batch"], t["trained"]) if not ok} == {(-1, -1)}
    main(["audit", "steps", ckpt_dir, "--steps", "6:7", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["samples_skipped"] == 16 and len(out["documents"]) == len(docs)
    assert main(["audit", "steps", ckpt_dir]) == 2
    assert "--steps A:B is required" in capsys.readouterr().err


def test_spike_detector_warms_up_then_flags_a_rise_and_ignores_falls():
    det = SpikeDetector(SpikesConfig(loss_z=5, warmup_steps=10, ema_steps=20, grad_norm_z=5))
    rng = np.random.default_rng(0)
    loss = 5 - 0.02 * np.arange(40) + rng.normal(0, 0.05, 40)
    assert det.check(1, 5.3, 1.0) is None  # warm-up: never a spike
    found = [det.check(s, float(x), 1.0) for s, x in enumerate(loss, start=2)]
    assert not any(found)
    spike = det.check(42, float(loss[-1] + 4), 1.0)
    assert spike is not None and spike.metric == "loss" and spike.z > 5
    assert det.check(43, float(loss[-1] + 4.1), 1.0) is not None  # the spike did not become the new normal
    assert det.check(44, float(loss[-1] - 1.5), 1.0) is None  # a fall is no spike
    g = det.check(45, float(loss[-1]), 40.0)
    assert g is not None and g.metric == "grad_norm"


class _Metrics:
    def __init__(self):
        self.records = []

    def write(self, record):
        self.records.append(record)


class _Trainer:
    """What trainer.rewind.on_spike reads of a Trainer, for the actions that do not rewind."""

    def __init__(self, action, rewinds=0):
        self.cfg = type("Cfg", (), {"spikes": SpikesConfig(action=action, max_rewinds=2)})()
        self.metrics, self.rank0, self.run_dir, self.rewinds = _Metrics(), True, "runs/x", rewinds


@pytest.mark.parametrize("action, rewinds, stops", [("log", 0, False), ("stop", 0, True), ("rewind_skip", 2, True)])
def test_spike_actions_log_or_stop_naming_the_audit_command(action, rewinds, stops):
    from gristmill.trainer.errors import TrainingError
    from gristmill.trainer.rewind import on_spike
    from gristmill.trainer.spikes import Spike

    trainer, spike = _Trainer(action, rewinds), Spike(40, "loss", 7.5, 2.5, 0.3, 16.7)
    if stops:
        with pytest.raises(TrainingError, match=r"loss spike at step 40.*gristmill audit steps runs/x --steps 38:40"):
            on_spike(trainer, spike)
    else:
        assert on_spike(trainer, spike) is False
    (rec,) = trainer.metrics.records
    assert rec["kind"] == "spike" and rec["step"] == 40 and rec["action"] == ("stop" if stops else "log")


def test_audit_steps_on_a_mixture_names_each_component_and_honours_a_rewind(tmp_path, capsys):
    import yaml

    from gristmill.loader.mixture import MixtureOrder
    from gristmill.manifests.mixture import load_data
    from gristmill.manifests.synthetic import build_synthetic
    from gristmill.trainer.meta import data_fields

    root = str(tmp_path / "data")
    build_synthetic(root, dataset="web", shard_rows=(40, 30), val_rows=(), seed=1)
    build_synthetic(root, dataset="code", shard_rows=(20,), val_rows=(), seed=2)
    job = tmp_path / "mix.yaml"
    job.write_text(yaml.safe_dump({"name": "blend", "store": os.path.join(root, "store"), "components": [
        {"dataset": "web", "weight": 0.75}, {"dataset": "code", "weight": 0.25}]}))
    assert main(["mix", str(job)]) == 0
    mix = load_data(os.path.join(root, "store", "blend"))
    recs = [REWIND]
    ckpt_dir = write_checkpoint_meta(str(tmp_path / "run"), mix, step=8, skips=recs,
                                     loader__next_index=skips.next_index(8, B, recs),
                                     **{f"data__{k}": v for k, v in data_fields(mix).items()})
    ckpt = read_checkpoint(ckpt_dir)
    report = audit_steps(mix, ckpt, (6, 7))
    # trained: steps 6-7 after the skip, [64, 80); skipped: what steps 6-7 would have read, [40, 56)
    index = np.r_[64:80, 40:56]
    comp, _, shard, row = MixtureOrder(mix, "train", 3, "global").locate_components(index)
    names = ["web", "code"]
    expected = {f"{names[c]}/doc-{s}-{r}" for c, s, r in zip(comp.tolist(), shard.tolist(), row.tolist())}
    docs = {d["doc_id"]: d for d in report.documents.to_pylist()}
    assert set(docs) == expected and report.summary["components"] == names
    assert report.summary["samples_trained"] == 16 and report.summary["samples_skipped"] == 16
    assert {d for d, x in docs.items() if x["samples_skipped"]} == \
        {f"{names[c]}/doc-{s}-{r}" for c, s, r in zip(comp[16:].tolist(), shard[16:].tolist(), row[16:].tolist())}
    capsys.readouterr()
    assert main(["audit", "steps", ckpt_dir, "--steps", "6:7"]) == 0
    assert "code/doc-" in capsys.readouterr().out
