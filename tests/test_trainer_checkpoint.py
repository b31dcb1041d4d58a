"""Hostile and edited checkpoints, in process (no training, no process group): DCP metadata and
entries are never unpickled beyond the checkpoint-metadata classes, and meta.json cannot
change the audit's answer without the checkpoint refusing to verify.

The checkpoints are the trainer's layout: meta.json from trainer/meta.py, DCP files holding a
tensor plus the data-position copy (helpers.write_dcp_checkpoint).
"""
import json
import os
import pickle
import re

import pytest
from helpers import Evil, reseal_meta, write_checkpoint_meta, write_dcp_checkpoint

from gristmill.audit import read_checkpoint
from gristmill.cli import main
from gristmill.trainer.checkpoint import load_state, read_dcp_metadata, verify
from gristmill.trainer.meta import CheckpointError

GLOBAL = r"refusing to unpickle (posix|os)\.system"


@pytest.fixture
def ckpt(tmp_path, toy_dataset):
    path = write_checkpoint_meta(str(tmp_path / "run"), toy_dataset, step=5)
    write_dcp_checkpoint(path)
    return path


def test_a_complete_checkpoint_verifies_and_audits(ckpt):
    assert verify(ckpt) == []
    assert main(["audit", "seen", ckpt, "--verify-checkpoint", "--json"]) == 0


def test_a_metadata_pickle_that_would_run_code_is_refused_naming_the_global(ckpt, tmp_path, capsys):
    marker = str(tmp_path / "PWNED")
    md = read_dcp_metadata(ckpt)
    md.planner_data = Evil(marker)  # a forger's payload inside an otherwise real DCP .metadata
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    reseal_meta(ckpt, lambda meta: None, files=True)  # meta.json's file hashes updated to match
    with pytest.raises(CheckpointError, match=GLOBAL):
        read_dcp_metadata(ckpt)
    problems = verify(ckpt)
    assert len(problems) == 1 and re.search(GLOBAL, problems[0])
    assert main(["audit", "seen", ckpt, "--verify-checkpoint"]) == 2
    assert "refusing to unpickle" in capsys.readouterr().err
    assert not os.path.exists(marker)


def test_a_non_tensor_entry_that_would_run_code_is_refused(tmp_path, toy_dataset):
    # Non-tensor entries (the optimizer's hyper-parameters) are torch.save blobs inside .distcp files.
    marker = str(tmp_path / "PWNED")
    path = write_checkpoint_meta(str(tmp_path / "run"), toy_dataset, step=5)
    write_dcp_checkpoint(path, {"extra": Evil(marker)})
    with pytest.raises(CheckpointError, match=r"DCP entry extra: refusing to unpickle (posix|os)\.system"):
        load_state({"extra": None}, path, no_dist=True)
    assert not os.path.exists(marker)


def test_a_consistent_resealed_edit_of_the_seed_is_refused_by_the_dcp_copy(ckpt, capsys):
    def edit(meta):  # both places the seed is recorded, and a fresh self-hash: meta.json alone looks fine
        meta["loader"]["seed"] = meta["job"]["data"]["seed"] = 4

    reseal_meta(ckpt, edit)
    assert read_checkpoint(ckpt).seed == 4  # without --verify-checkpoint the audit trusts meta.json as written
    problems = verify(ckpt)
    assert len(problems) == 1 and "loader.seed is 4 in meta.json but 3 in the DCP state" in problems[0]
    assert main(["audit", "seen", ckpt, "--verify-checkpoint"]) == 2
    assert "loader.seed is 4 in meta.json but 3 in the DCP state" in capsys.readouterr().err


def test_a_consistent_resealed_edit_of_the_global_batch_is_refused_by_the_dcp_copy(ckpt):
    def edit(meta):  # every place global batch is recorded, kept consistent with step x B
        meta["global_batch"] = meta["job"]["data"]["global_batch"] = 16
        meta["loader"]["next_index"] = meta["step"] * 16

    reseal_meta(ckpt, edit)
    assert read_checkpoint(ckpt).global_batch == 16
    assert "global_batch is 16 in meta.json but 8 in the DCP state" in verify(ckpt)[0]


def test_an_edit_without_a_fresh_self_hash_fails_verification(ckpt):
    meta_path = os.path.join(ckpt, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["loader"]["seed"] = meta["job"]["data"]["seed"] = 4
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    (problem,) = verify(ckpt)
    assert "meta_sha256" in problem and "edited after the trainer wrote it" in problem
