"""Two-tier checkpoints without training (seconds): the commit protocol of the committed tier on a local
disk and on S3 (the local moto server), retention with milestones, the auto cadence (Young/Daly from the
measured save cost and the job's MTBF) and the run record. The end-to-end runs (torchrun, kill -9 during
an upload, resume from S3) are tests/test_trainer_s3.py."""
from __future__ import annotations

import json
import math
import os

import pytest

from gristmill.trainer.cadence import AUTO, Cadence, describe, expected_waste, job_mtbf_s
from gristmill.trainer.checkpoint_store import CheckpointStore, owner, rank_file, rank_manifest, to_prune
from gristmill.trainer.errors import CheckpointError
from gristmill.trainer.meta import IMAGE_DIGEST_ENV, nvidia_driver_version, run_record


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "checkpoints")
    return f"{request.getfixturevalue('s3')}/run/checkpoints"


def _stage(tmp_path, rank: int, payload: bytes) -> tuple[str, dict]:
    """A local directory holding rank ``rank``'s one DCP file (rank 0: also .metadata)."""
    from gristmill.trainer.checkpoint import file_checksums

    local = tmp_path / f"local-{rank}"
    local.mkdir(exist_ok=True)
    names = [f"__{rank}_0.distcp"] + ([".metadata"] if rank == 0 else [])
    for name in names:
        (local / name).write_bytes(payload + name.encode())
    return str(local), file_checksums(str(local), sorted(names))


# -- the commit protocol ------------------------------------------------------------------------
def test_a_step_commits_only_with_every_ranks_files_and_meta_json_last(where, tmp_path):
    ckpts = CheckpointStore(where)
    uploads = []
    for rank in (0, 1):
        local, files = _stage(tmp_path, rank, b"x" * (100 + rank))
        for rel in files:
            ckpts.upload(local, 6, rel)
        uploads.append((rank, files))
    ckpts.put(6, rank_file(0), rank_manifest(6, 0, 2, uploads[0][1]))
    assert ckpts.steps() == [6] and ckpts.committed() == []  # files but no meta.json: no checkpoint
    ckpts.put(6, rank_file(1), rank_manifest(6, 1, 2, uploads[1][1]))
    files = ckpts.gather_ranks(6, 2)
    assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp", "rank-0.json", "rank-1.json"]
    ckpts.commit(6, b'{"x": 1}\n')
    assert ckpts.committed() == [6] and ckpts.read_meta_bytes(6) == b'{"x": 1}\n'
    with pytest.raises(CheckpointError, match="already exists; another job writes checkpoints"):
        ckpts.commit(6, b'{"x": 2}\n')  # a conditional create: the first commit stands
    assert ckpts.read_meta_bytes(6) == b'{"x": 1}\n'


def test_a_cut_short_upload_is_never_committed_and_is_removed_at_the_next_start(where, tmp_path):
    ckpts = CheckpointStore(where)
    local, files = _stage(tmp_path, 0, b"y" * 50)
    for rel in files:
        ckpts.upload(local, 4, rel)
    ckpts.put(4, rank_file(0), rank_manifest(4, 0, 1, files))
    ckpts.commit(4, b"{}\n")
    ckpts.upload(local, 8, "__0_0.distcp")  # step 8: killed before its .metadata and manifest were uploaded
    assert ckpts.steps() == [4, 8] and ckpts.committed() == [4]
    assert ckpts.remove_uncommitted() == [8]
    assert ckpts.steps() == [4] and ckpts.committed() == [4]


def test_a_file_of_the_wrong_size_on_the_store_refuses_the_commit(where, tmp_path):
    ckpts = CheckpointStore(where)
    local, files = _stage(tmp_path, 0, b"z" * 64)
    for rel in files:
        ckpts.upload(local, 2, rel)
    ckpts.put(2, "__0_0.distcp", b"short")  # what the store holds is not what the rank hashed
    ckpts.put(2, rank_file(0), rank_manifest(2, 0, 1, files))
    with pytest.raises(CheckpointError, match=r"not committed: __0_0.distcp \(5 bytes, 76 expected\)"):
        ckpts.gather_ranks(2, 1)


def test_a_rank_manifest_may_list_only_that_ranks_files(where, tmp_path):
    ckpts = CheckpointStore(where)
    local, files = _stage(tmp_path, 1, b"w" * 10)
    ckpts.put(2, rank_file(0), rank_manifest(2, 0, 1, files))  # rank 0 claims rank 1's file
    with pytest.raises(CheckpointError, match="lists __1_0.distcp, which rank 0 does not write"):
        ckpts.gather_ranks(2, 1)


def test_a_download_refuses_names_outside_the_checkpoint(tmp_path):
    ckpts = CheckpointStore(str(tmp_path / "checkpoints"))
    with pytest.raises(CheckpointError, match=r"lists '../../etc/passwd', not a checkpoint file name"):
        ckpts.download(2, "../../etc/passwd", str(tmp_path / "local"))
    assert [owner(n) for n in (".metadata", "__3_0.distcp", "rank-2.json", "meta.json", "x/__0_0.distcp")] == \
        [0, 3, 2, None, None]


def test_one_tier_is_the_local_directory_itself(tmp_path):
    local = str(tmp_path / "run" / "checkpoints")
    assert CheckpointStore(local).is_dir(local)
    assert CheckpointStore(f"file://{local}").is_dir(local)
    assert not CheckpointStore(str(tmp_path / "nfs")).is_dir(local)


def test_the_runs_logs_go_beside_the_checkpoints_in_whole_lines(where, tmp_path):
    ckpts = CheckpointStore(where)
    log = tmp_path / "metrics.jsonl"
    log.write_bytes(b'{"step": 1}\n{"step": 2}\n{"ste')  # the trainer is appending line 3
    ckpts.put_run_file(str(log))
    fresh = tmp_path / "fresh" / "metrics.jsonl"
    assert ckpts.get_run_file(str(fresh)) and fresh.read_bytes() == b'{"step": 1}\n{"step": 2}\n'
    assert not ckpts.get_run_file(str(tmp_path / "fresh" / "samples.jsonl"))


# -- retention ------------------------------------------------------------------------------------
def test_retention_keeps_the_newest_and_the_milestones():
    steps = [2, 4, 6, 8, 10, 12]
    assert to_prune(steps, keep=2, keep_every=0) == [2, 4, 6, 8]
    assert to_prune(steps, keep=2, keep_every=4) == [2, 6]  # 10, 12 the newest; 4, 8 milestones
    assert to_prune(steps + [14], keep=2, keep_every=4) == [2, 6, 10]  # 10 is no longer among the newest
    assert to_prune(steps, keep=10, keep_every=0) == []
    assert to_prune([5], keep=1, keep_every=0) == []


def test_prune_removes_only_committed_steps_beyond_retention(where, tmp_path):
    ckpts = CheckpointStore(where)
    local, files = _stage(tmp_path, 0, b"p")
    for step in (2, 4, 6, 8):
        ckpts.upload(local, step, "__0_0.distcp")
        ckpts.commit(step, b"{}\n")
    ckpts.upload(local, 10, "__0_0.distcp")  # in flight: not committed, not pruned
    assert ckpts.prune(ckpts.committed(), keep=2, keep_every=4) == [2]
    assert ckpts.steps() == [4, 6, 8, 10] and ckpts.committed() == [4, 6, 8]


# -- cadence ----------------------------------------------------------------------------------------
def test_the_jobs_mtbf_is_the_devices_divided_by_their_number_unless_given():
    assert job_mtbf_s(50_000, 1024) == pytest.approx(50_000 / 1024 * 3600)
    assert job_mtbf_s(50_000, 1024, mtbf_hours=24) == 24 * 3600


def test_young_daly_minimises_the_expected_waste():
    cost, mtbf = 20.0, 4 * 3600.0
    tau = math.sqrt(2 * cost * mtbf)
    at = expected_waste(tau, cost, mtbf)
    assert at["saves_pct"] == pytest.approx(100 * cost / tau)
    assert at["recompute_pct"] == pytest.approx(100 * (tau + cost) / (2 * mtbf))
    for other in (tau / 3, tau / 1.5, tau * 1.5, tau * 3):
        assert expected_waste(other, cost, mtbf)["total_pct"] > at["total_pct"]


def test_auto_saves_first_after_a_few_steps_then_at_the_young_daly_interval_re_evaluated():
    mtbf = 2 * 3600.0
    c = Cadence(AUTO, mtbf_s=mtbf, first_steps=10)
    assert [s for s in range(1, 30) if c.due(s)][0] == 10
    first = c.measured(10, save_s=4.0, step_s=2.0)  # sqrt(2 * 4 * 7200) = 240 s = 120 steps
    assert first["young_daly_every"] == 120 and c.next_due == 130 and not c.due(129) and c.due(130)
    second = c.measured(130, save_s=16.0, step_s=2.0)  # median cost (4 + 16) / 2 = 10: sqrt(2 * 10 * 7200) = 379.5 s
    assert second["save_cost_s"] == 10.0 and second["young_daly_every"] == 190 and c.next_due == 320
    assert second["waste_fixed"] is None and second["every"] == AUTO
    assert "checkpoint.every=auto: next save in 190 steps" in describe(second)
    resumed = Cadence(AUTO, mtbf_s=mtbf, first_steps=10)
    resumed.start(500)  # a resume after step 500: the first save measures this process's cost, 10 steps on
    assert not resumed.due(509) and resumed.due(510)


def test_a_fixed_cadence_reports_its_waste_beside_young_dalys():
    c = Cadence(50, mtbf_s=3600.0, first_steps=10)
    assert [s for s in range(1, 151) if c.due(s)] == [50, 100, 150]
    rec = c.measured(50, save_s=1.0, step_s=1.0)  # Young/Daly: sqrt(2 * 1 * 3600) = 85 steps
    assert rec["young_daly_every"] == 85 and rec["waste_fixed"]["interval_s"] == 50
    assert rec["waste_fixed"]["total_pct"] > rec["waste_young_daly"]["total_pct"]
    assert "configured checkpoint.every=50: expected waste" in describe(rec)
    assert Cadence(0, mtbf_s=1.0, first_steps=1).due(10) is False


def test_every_auto_is_accepted_by_the_job_file_and_anything_else_named():
    from gristmill.errors import ConfigError
    from gristmill.trainer.config import load

    job = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "train-tiny.yaml")
    assert load(job, ["checkpoint.every=auto"]).checkpoint.every == AUTO
    with pytest.raises(ConfigError, match=r"checkpoint.every: expected an integer >= 0 or auto, got 'often'"):
        load(job, ["checkpoint.every=often"])


def test_storage_options_stay_out_of_the_recorded_job():
    from gristmill.trainer.config import TrainConfig

    cfg = TrainConfig.model_validate({"data": {"manifest": "m"}, "checkpoint": {
        "dir": "s3://b/run", "storage_options": {"secret": "s3cr3t"}}})
    recorded = cfg.content_dict()
    assert recorded["checkpoint"]["dir"] == "s3://b/run" and "s3cr3t" not in json.dumps(recorded)


# -- the run record ---------------------------------------------------------------------------------
def test_the_run_record_names_tokenizer_device_image_and_hosts(tmp_path):
    record = run_record(device_name="NVIDIA H100 80GB HBM3", tokenizer_sha256="ab" * 32, hostnames=["n1", "n2"],
                        environ={IMAGE_DIGEST_ENV: "sha256:" + "cd" * 32})
    assert record["tokenizer_sha256"] == "ab" * 32 and record["device"] == "NVIDIA H100 80GB HBM3"
    assert record["image_digest"] == "sha256:" + "cd" * 32 and record["hostnames"] == ["n1", "n2"]
    assert set(record) >= {"cuda", "cuda_driver", "nccl"}  # None where absent (a CPU run)
    assert run_record(device_name="cpu", tokenizer_sha256="x", hostnames=["h"], environ={})["image_digest"] is None
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n")
    assert nvidia_driver_version(str(version)) == "550.54.15"
    assert nvidia_driver_version(str(tmp_path / "absent")) is None
