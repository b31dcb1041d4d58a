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
from gristmill.trainer.meta import CheckpointError


class _Lazy:
    """gristmill.trainer.checkpoint on first use, not at collection (torch.distributed.checkpoint: ~1 s of
    import in each worker, of which only the one running this file needs it)."""

    def __getattr__(self, name):
        if name.startswith("_") or name.startswith("pytest"):  # what collection asks of every module attribute
            raise AttributeError(name)
        import gristmill.trainer.checkpoint as module

        return getattr(module, name)


checkpoint = _Lazy()


GLOBAL = r"refusing to unpickle (posix|os)\.system"


@pytest.fixture
def ckpt(tmp_path, toy_dataset):
    path = write_checkpoint_meta(str(tmp_path / "run"), toy_dataset, step=5)
    write_dcp_checkpoint(path)
    return path


def test_a_complete_checkpoint_verifies_and_audits(ckpt):
    assert checkpoint.verify(ckpt) == []
    assert main(["audit", "seen", ckpt, "--verify-checkpoint", "--json"]) == 0


def test_a_metadata_pickle_that_would_run_code_is_refused_naming_the_global(ckpt, tmp_path, capsys):
    marker = str(tmp_path / "PWNED")
    md = checkpoint.read_dcp_metadata(ckpt)
    md.planner_data = Evil(marker)  # a forger's payload inside an otherwise real DCP .metadata
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    reseal_meta(ckpt, lambda meta: None, files=True)  # meta.json's file hashes updated to match
    with pytest.raises(CheckpointError, match=GLOBAL):
        checkpoint.read_dcp_metadata(ckpt)
    problems = checkpoint.verify(ckpt)
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
        checkpoint.load_state({"extra": None}, path, no_dist=True)
    assert not os.path.exists(marker)


def test_a_consistent_resealed_edit_of_the_seed_is_refused_by_the_dcp_copy(ckpt, capsys):
    def edit(meta):  # both places the seed is recorded, and a fresh self-hash: meta.json alone looks fine
        meta["loader"]["seed"] = meta["job"]["data"]["seed"] = 4

    reseal_meta(ckpt, edit)
    assert read_checkpoint(ckpt).seed == 4  # without --verify-checkpoint the audit trusts meta.json as written
    problems = checkpoint.verify(ckpt)
    assert len(problems) == 1 and "loader.seed is 4 in meta.json but 3 in the DCP state" in problems[0]
    assert main(["audit", "seen", ckpt, "--verify-checkpoint"]) == 2
    assert "loader.seed is 4 in meta.json but 3 in the DCP state" in capsys.readouterr().err


def test_a_consistent_resealed_edit_of_the_global_batch_is_refused_by_the_dcp_copy(ckpt):
    def edit(meta):  # every place global batch is recorded, kept consistent with step x B
        meta["global_batch"] = meta["job"]["data"]["global_batch"] = 16
        meta["loader"]["next_index"] = meta["step"] * 16
        meta["tokens_seen"] = meta["step"] * 16 * meta["seq_len"]

    reseal_meta(ckpt, edit)
    assert read_checkpoint(ckpt).global_batch == 16
    assert "global_batch is 16 in meta.json but 8 in the DCP state" in checkpoint.verify(ckpt)[0]


def test_an_edit_without_a_fresh_self_hash_fails_verification(ckpt):
    meta_path = os.path.join(ckpt, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["loader"]["seed"] = meta["job"]["data"]["seed"] = 4
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    (problem,) = checkpoint.verify(ckpt)
    assert "meta_sha256" in problem and "edited after the trainer wrote it" in problem


# -- storage entries, the DCP states resume checks, decompression bombs (issue 26) ------------------
def _edit_dcp_metadata(ckpt: str, edit) -> None:
    """Rewrite the checkpoint's DCP .metadata through ``edit(md)`` and reseal meta.json's file hashes."""
    md = checkpoint.read_dcp_metadata(ckpt)
    edit(md)
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    reseal_meta(ckpt, lambda meta: None, files=True)


def _one_line_refusal(ckpt: str, capsys, needle: str) -> None:
    capsys.readouterr()
    assert main(["audit", "seen", ckpt, "--verify-checkpoint"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize("rel", ["../step-2/__0_0.distcp", "/tmp/__0_0.distcp", "sub/__0_0.distcp", "__0_0.distcp\0",
                                 "meta.json"])
def test_storage_entries_outside_the_checkpoints_data_files_are_refused_on_verify_and_resume(tmp_path, toy_dataset,
                                                                                             capsys, rel):
    run = str(tmp_path / "run")
    for step in (2, 4):
        write_dcp_checkpoint(write_checkpoint_meta(run, toy_dataset, step=step))
    step2, step4 = (os.path.join(run, "checkpoints", f"step-{n}") for n in (2, 4))

    def splice(md):  # step 4's weights read from step 2's file: "resumed from step 4" with step 2's weights
        for index, info in md.storage_data.items():
            if index.fqn.startswith("model."):
                info.relative_path = rel

    _edit_dcp_metadata(step4, splice)
    (problem,) = checkpoint.verify(step4)
    assert f"the storage entry of 'model.weight' points at {rel!r}, not a data file of this checkpoint" in problem
    assert checkpoint.find_resumable(run) == (step2, [f"step-4: {problem}"])  # resume passes it over, as the audit refuses it
    _one_line_refusal(step4, capsys, "points at")


def test_storage_entries_past_the_end_of_their_file_or_through_a_link_are_refused(ckpt, tmp_path, capsys):
    def past_end(md):
        for index, info in md.storage_data.items():
            if index.fqn == "train_state.step":
                info.offset = os.path.getsize(os.path.join(ckpt, "__0_0.distcp"))

    _edit_dcp_metadata(ckpt, past_end)
    assert "the storage entry of 'train_state.step' spans bytes" in checkpoint.verify(ckpt)[0]
    os.symlink(os.path.join(ckpt, "__0_0.distcp"), os.path.join(ckpt, "__1_0.distcp"))
    reseal_meta(ckpt, lambda meta: None, files=True)
    assert "__1_0.distcp: a link; a checkpoint holds only its own regular files" in checkpoint.verify(ckpt)[0]


def test_a_resealed_edit_of_meta_and_the_dcp_position_together_is_refused_by_the_dcp_loader_state(ckpt, capsys):
    original = read_checkpoint(ckpt).meta["loader"]

    def edit(meta):
        meta["loader"]["seed"] = meta["job"]["data"]["seed"] = 4

    reseal_meta(ckpt, edit)
    # The forger rewrites the DCP state's data position to match (and reseals the file hashes); the
    # loader state inside the DCP state, which resume restores, still holds seed 3.
    write_dcp_checkpoint(ckpt, {"loader": original})
    (problem,) = checkpoint.verify(ckpt)
    assert "loader {" in problem and "differs from the DCP loader state" in problem and "'seed': 3" in problem
    _one_line_refusal(ckpt, capsys, "differs from the DCP loader state")


def test_a_dcp_train_state_of_another_step_is_refused(ckpt, capsys):
    meta = read_checkpoint(ckpt).meta
    write_dcp_checkpoint(ckpt, {"train_state": {"step": 4, "tokens_seen": 0, "skipped_total": 0,
                                                "consecutive_bad": 0}})
    assert checkpoint.verify(ckpt) == [f"{ckpt}/meta.json: step {meta['step']} but the DCP train state says 4"]


def test_a_checkpoint_missing_a_trainer_state_is_refused_by_verify(ckpt):
    from gristmill.trainer.checkpoint import STATES

    def drop_optimizer(md):
        md.state_dict_metadata = {k: v for k, v in md.state_dict_metadata.items() if not k.startswith("optimizer.")}

    _edit_dcp_metadata(ckpt, drop_optimizer)
    assert "optimizer" in STATES
    assert "the DCP state has no optimizer entries" in checkpoint.verify(ckpt)[0]


def test_a_decompression_bomb_in_a_dcp_entry_is_refused_before_it_is_inflated(ckpt, capsys):
    import io
    import zipfile

    import torch

    from gristmill.trainer.meta import DCP_KEY

    # torch.load inflates a deflated member of a torch.save archive whatever its size: 64 MiB of zeros
    # deflate to ~64 KiB. Appended to the data file, the data position entry re-pointed at it.
    blob = io.BytesIO()
    torch.save(torch.zeros(64 << 20, dtype=torch.uint8), blob)
    bomb = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(blob.getvalue())) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for name in src.namelist():
            dst.writestr(name, src.read(name))
    data = os.path.join(ckpt, "__0_0.distcp")
    offset = os.path.getsize(data)
    with open(data, "ab") as f:
        f.write(bomb.getvalue())
    assert len(bomb.getvalue()) < 1 << 20

    def point_at_bomb(md):
        for index, info in md.storage_data.items():
            if index.fqn == DCP_KEY:
                info.offset, info.length = offset, len(bomb.getvalue())

    _edit_dcp_metadata(ckpt, point_at_bomb)
    (problem,) = checkpoint.verify(ckpt)
    assert "is compressed or larger than its entry" in problem
    _one_line_refusal(ckpt, capsys, "decompression bomb")


def test_dcp_stream_transforms_are_refused(tmp_path, toy_dataset, capsys):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    ckpt = write_checkpoint_meta(str(tmp_path / "run"), toy_dataset, step=5)
    write_dcp_checkpoint(ckpt)
    state = {"extra": b"\0" * 4096}
    dcp.save(state, storage_writer=FileSystemWriter(os.path.join(ckpt, "z"), _extensions=[ZStandard()]), no_dist=True)
    zmd = read_dcp_metadata_unchecked(os.path.join(ckpt, "z"))

    def adopt_transform(md):  # the zstd entry (whose output nothing bounds) in place of the loader seed
        (zinfo,) = zmd.storage_data.values()
        for index, info in md.storage_data.items():
            if index.fqn == "loader.seed":
                info.transform_descriptors = zinfo.transform_descriptors

    import shutil
    shutil.rmtree(os.path.join(ckpt, "z"))
    _edit_dcp_metadata(ckpt, adopt_transform)
    (problem,) = checkpoint.verify(ckpt)
    assert "the storage entry of 'loader.seed' has stream transforms" in problem
    _one_line_refusal(ckpt, capsys, "stream transforms")


def read_dcp_metadata_unchecked(path):
    with open(os.path.join(path, ".metadata"), "rb") as f:
        return pickle.load(f)  # a test's own file, written just above


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e999", "9" * 5000])
def test_a_meta_json_with_nan_or_a_huge_number_is_a_one_line_error(ckpt, capsys, literal):
    path = os.path.join(ckpt, "meta.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace('"step": 5', f'"step": 5, "extra": {literal}', 1))
    assert checkpoint.verify(ckpt)[0].startswith(f"{path}: ")
    _one_line_refusal(ckpt, capsys, "meta.json")
