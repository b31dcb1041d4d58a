"""End to end: a real CPU training run (two ranks under torchrun), then the audit of its checkpoint.

The audit's answer must equal what the trainer logged (samples.jsonl: the global indices of
every step, in rank order) and the rows the loader actually served (the toy dataset's rows
start with (shard + 1, row), so the served tokens say which row each sample was).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import build_dataset, flip_byte, reseal_meta

from gristmill.audit import CheckpointError, audit_doc, consumed, open_manifest, parse_steps, read_checkpoint
from gristmill.audit.checkpoint import verify_files
from gristmill.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, B, W, SEED = 6, 8, 2, 5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("audit-train"))
    published = build_dataset(os.path.join(root, "data"))
    run_dir = os.path.join(root, "run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={W}", "-m", "gristmill.cli",
           "train", os.path.join(ROOT, "configs", "train-tiny.yaml"),
           "--set", f"data.manifest={published.url}", "--set", f"run.dir={run_dir}", "--set", f"run.steps={STEPS}",
           "--set", "checkpoint.every=3", "--set", "eval.every=0", "--set", f"data.seed={SEED}",
           "--set", f"data.global_batch={B}", "--set", "run.tensorboard=false", "--set", "data.prefetch=1",
           "--set", "run.log_samples=true"]  # the first-hand record the audit is compared with
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(run_dir, "samples.jsonl")) as f:
        logged = [json.loads(line) for line in f]
    return published, run_dir, logged


def test_audit_equals_the_indices_the_trainer_logged(trained):
    published, run_dir, logged = trained
    ckpt = read_checkpoint(run_dir)  # the newest: step-6
    assert (ckpt.step, ckpt.world_size, ckpt.seed) == (STEPS, W, SEED)
    used = consumed(open_manifest(ckpt).manifest, ckpt)
    assert [r["step"] for r in logged] == list(range(1, STEPS + 1))
    for record in logged:
        sel = used.step == record["step"]
        assert used.index[sel].tolist() == record["indices"]  # rank 0's slice, then rank 1's
        assert used.rank[sel].tolist() == [0] * (B // W) + [1] * (B // W)
    # The older checkpoint answers for its own steps only.
    early = consumed(published.manifest, read_checkpoint(os.path.join(run_dir, "checkpoints", "step-3")))
    assert early.index.tolist() == [i for r in logged[:3] for i in r["indices"]]


def test_audit_rows_are_the_rows_the_loader_served(trained):
    published, run_dir, _ = trained
    from gristmill.loader import Caching, Loader, Sampling, Threads

    ckpt = read_checkpoint(run_dir)
    used = consumed(published.manifest, ckpt, parse_steps("2:4", ckpt))
    served = []
    for rank in range(W):  # what each rank's loader serves for steps 2..4, resumed from step 1's state
        ld = Loader(published.url,
                    Sampling(split="train", seed=SEED, global_batch=B, rank=rank, world_size=W, order="global"),
                    caching=Caching(dir=os.path.join(run_dir, f"cache-{rank}")), threads=Threads(prefetch=1))
        ld.load_state_dict({**ld.state_dict(), "next_index": B})
        it = iter(ld)
        served.append([next(it)["input_ids"][:, :2].numpy() for _ in range(3)])
    tokens = np.concatenate([np.concatenate([served[r][s] for r in range(W)]) for s in range(3)])
    assert (tokens[:, 0] - 1).tolist() == used.shard.tolist()  # first token: shard + 1
    assert tokens[:, 1].tolist() == used.row.tolist()  # second token: row


def test_cli_doc_names_the_step_and_rank_of_a_logged_sample(trained, capsys):
    published, run_dir, logged = trained
    ckpt = read_checkpoint(run_dir)
    used = consumed(published.manifest, ckpt)
    i = logged[4]["indices"][5]  # step 5, rank 1 (second half of the step's indices)
    doc = f"doc-{used.shard[i]}-{used.row[i]}"
    answer = audit_doc(published, ckpt, used, doc)
    assert answer["seen"] and (5, 1, i) in [(o["step"], o["rank"], o["index"]) for o in answer["occurrences"]]
    assert main(["audit", "doc", run_dir, doc, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == answer["steps"]


def test_an_edited_seed_a_corrupt_checkpoint_or_a_swapped_manifest_is_detected(trained, tmp_path, capsys):
    published, run_dir, _ = trained
    ckpt_dir = str(tmp_path / "step-6")
    shutil.copytree(os.path.join(run_dir, "checkpoints", "step-6"), ckpt_dir)
    meta_path = os.path.join(ckpt_dir, "meta.json")
    with open(meta_path) as f:
        original = json.load(f)

    def loader_seed(meta):
        meta["loader"]["seed"] = SEED + 1

    def job_seed(meta):
        meta["job"]["data"]["seed"] = SEED + 1

    # Re-sealed, one copy edited: the fields recorded twice disagree.
    reseal_meta(ckpt_dir, loader_seed)
    with pytest.raises(CheckpointError, match=f"loader.seed {SEED + 1} differs from the job config's data.seed {SEED}"):
        read_checkpoint(ckpt_dir)
    # Re-sealed, both copies edited: meta.json alone is consistent, the DCP state's copy is not.
    reseal_meta(ckpt_dir, job_seed)
    assert read_checkpoint(ckpt_dir).seed == SEED + 1
    assert main(["audit", "seen", ckpt_dir, "--verify-checkpoint", "--json"]) == 2
    assert f"loader.seed is {SEED + 1} in meta.json but {SEED} in the DCP state" in capsys.readouterr().err
    # Not re-sealed: the self-hash refuses it before anything else.
    with open(meta_path, "w") as f:
        json.dump({**original, "loader": {**original["loader"], "seed": SEED + 1}}, f)
    with pytest.raises(CheckpointError, match="meta_sha256 .* edited after the trainer wrote it"):
        read_checkpoint(ckpt_dir)
    assert main(["audit", "seen", run_dir, "--verify-checkpoint", "--json"]) == 0  # the untouched run verifies
    capsys.readouterr()

    dcp_file = next(f for f in os.listdir(ckpt_dir) if f.endswith(".distcp"))
    flip_byte(os.path.join(ckpt_dir, dcp_file))
    with open(meta_path, "w") as f:
        json.dump(original, f)
    with pytest.raises(CheckpointError, match=f"{dcp_file}: sha256 .* does not match meta.json"):
        verify_files(read_checkpoint(ckpt_dir))
    other = build_dataset(str(tmp_path / "other"), seed=1)
    assert main(["audit", "leak", run_dir, "--manifest", other.url, "--eval", meta_path]) == 2


def test_leak_of_a_trained_row_is_found_at_its_step_and_a_clean_set_is_not(trained, tmp_path, capsys):
    published, run_dir, logged = trained
    from gristmill.manifests import read_rows
    from tokenizers import Tokenizer

    ckpt = read_checkpoint(run_dir)
    used = consumed(published.manifest, ckpt)
    i = logged[2]["indices"][3]  # step 3
    row = read_rows(os.path.join(published.url, published.manifest.shards[used.shard[i]].path))[used.row[i]]
    tok = Tokenizer.from_file(os.path.join(published.url, "tokenizer.json"))
    planted = tok.decode(row[2:16].tolist())  # 14 of the row's words: past the (shard, row) markers
    clean = " ".join(f"w{w}" for w in range(2, 40, 2))  # consecutive even words: not a row of this dataset
    for name, text, code in (("planted.jsonl", planted, 1), ("clean.jsonl", clean, 0)):
        path = tmp_path / name
        path.write_text(json.dumps({"text": text}) + "\n")
        assert main(["audit", "leak", run_dir, "--eval", str(path), "--json"]) == code
        summary = json.loads(capsys.readouterr().out)
        assert summary["items_leaked"] == code
        if code:
            assert 3 in summary["steps"] and summary["documents_leaked"] == 1
