"""The audit against checkpoint metadata written through trainer.meta and the real loader order (fast).

The toy dataset's rows start with (shard + 1, row): the tokens themselves say which row a
sample is, so the audit's answer is checked against the shards' content, not against itself.
"""
import json
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import build_dataset, write_checkpoint_meta

from gristmill.audit import (AuditError, CheckpointError, audit_doc, audit_seen, consumed, open_manifest, parse_steps,
                             read_checkpoint)
from gristmill.cli import main
from gristmill.loader.order import samples_at
from gristmill.manifests import HashMismatchError, read_rows
from gristmill.manifests.synthetic import source_uri

B, W = 8, 2  # global batch, world size


def write_meta(run_dir, published, *, step, **fields):
    """A checkpoint meta.json with the trainer's schema, this module's global batch and world size."""
    return write_checkpoint_meta(run_dir, published, step=step, **{"global_batch": B, "world_size": W, **fields})


def served_rows(published, indices):
    """(shard, row) that global indices read, from the token content of the shards (markers)."""
    m = published.manifest
    shard, row = samples_at(m, "train", 3, "global", indices)
    tokens = {i: read_rows(os.path.join(published.url, s.path)) for i, s in enumerate(m.shards)}
    first = np.array([tokens[s][r, :2] for s, r in zip(shard, row)])
    return first[:, 0] - 1, first[:, 1]


@pytest.fixture
def run(tmp_path, toy_dataset):
    # 120 train rows, 20 steps of 8 = 160 samples: a full epoch and part of a second.
    return toy_dataset, write_meta(str(tmp_path / "run"), toy_dataset, step=20)


def test_seen_reconstructs_steps_ranks_and_rows(run):
    published, ckpt_dir = run
    ckpt = read_checkpoint(ckpt_dir)
    used = consumed(published.manifest, ckpt)
    assert used.index.tolist() == list(range(160))
    assert used.step.tolist() == [i // B + 1 for i in range(160)]  # optimizer steps count from 1
    assert used.rank.tolist() == [(i % B) // (B // W) for i in range(160)]
    shard, row = served_rows(published, used.index)
    assert used.shard.tolist() == shard.tolist() and used.row.tolist() == row.tolist()
    # One full epoch: every train row seen once, 40 of them twice.
    report = audit_seen(published, used, parse_steps(None, ckpt))
    s = report.summary
    assert (s["samples"], s["rows_seen"], s["rows_seen_more_than_once"]) == (160, 120, 40)
    assert s["documents_seen"] == s["documents_fully_seen"] == 120
    assert s["token_exposures"] == 160 * 17 and s["tokens_seen"] == 120 * 17
    assert sum(e["samples"] for e in s["by_shard"].values()) == 160
    assert s["by_lang"]["en"]["token_exposures"] == 160 * 17


def test_steps_range_selects_exactly_those_samples(run):
    published, ckpt_dir = run
    ckpt = read_checkpoint(ckpt_dir)
    steps = parse_steps("4:5", ckpt)  # inclusive: optimizer steps 4 and 5 = indices [24, 40)
    used = consumed(published.manifest, ckpt, steps)
    assert used.index.tolist() == list(range(24, 40))
    report = audit_seen(published, used, steps)
    shard, row = served_rows(published, np.arange(24, 40))
    expected = sorted(f"doc-{s}-{r}" for s, r in zip(shard, row))
    assert sorted(report.documents.column("doc_id").to_pylist()) == expected
    assert set(report.documents.column("first_step").to_pylist()) <= {4, 5}
    assert report.summary["by_file"]  # per input file
    assert parse_steps("7", ckpt) == (7, 7) and parse_steps(":2", ckpt) == (1, 2) and parse_steps("18:", ckpt) == (18, 20)
    assert parse_steps(None, ckpt) == (1, 20)
    for bad, why in (("5:3", "1 <= A <= B"), ("0:3", "1 <= A <= B"), ("x:y", "expected A:B"), ("20:30", "only 20 steps")):
        with pytest.raises(AuditError, match=why):
            parse_steps(bad, ckpt)


def test_doc_reports_steps_ranks_and_provenance(run):
    published, ckpt_dir = run
    ckpt = read_checkpoint(ckpt_dir)
    used = consumed(published.manifest, ckpt)
    shard, row = served_rows(published, np.arange(160))
    i = 150  # seen in the second epoch: its row was also seen once in the first
    doc_id = f"doc-{shard[i]}-{row[i]}"
    answer = audit_doc(published, ckpt, used, doc_id)
    hits = [j for j in range(160) if (shard[j], row[j]) == (shard[i], row[i])]
    assert answer["seen"] and answer["fully_seen"] and len(hits) == 2
    assert [(o["step"], o["rank"], o["index"]) for o in answer["occurrences"]] == [(j // B + 1, (j % B) // (B // W), j) for j in hits]
    assert answer["provenance"]["source"] == source_uri(shard[i]) and answer["provenance"]["position"] == row[i]
    assert answer["provenance"]["url"] is None  # the synthetic inputs have no URLs (tests/test_provenance.py has them)
    # A row of the second epoch not reached by step 20 was never seen.
    first_epoch_only = {(s, r) for s, r in zip(shard[:120], row[:120])} - {(s, r) for s, r in zip(shard[120:], row[120:])}
    s, r = sorted(first_epoch_only)[0]
    early = consumed(published.manifest, ckpt, (1, 1))
    assert audit_doc(published, ckpt, early, f"doc-{s}-{r}")["seen"] == ((s, r) in set(zip(shard[:8], row[:8])))
    with pytest.raises(AuditError, match="not in the document index"):
        audit_doc(published, ckpt, used, "no-such-doc")


def test_tampered_manifest_is_refused(run, tmp_path):
    published, ckpt_dir = run
    manifest_path = os.path.join(published.url, "manifest.json")
    with open(manifest_path) as f:
        d = json.load(f)
    d["stats"]["pack"]["rows"] += 1  # edited after publishing: its recorded sha256 no longer matches
    with open(manifest_path, "w") as f:
        json.dump(d, f)
    with pytest.raises(HashMismatchError, match="edited after publishing"):
        open_manifest(read_checkpoint(ckpt_dir))


def test_a_different_manifest_is_refused_naming_both_hashes(run, tmp_path):
    published, ckpt_dir = run
    other = build_dataset(str(tmp_path / "other"), seed=1)  # same shape, other content
    with pytest.raises(AuditError) as e:
        open_manifest(read_checkpoint(ckpt_dir), other.url)
    assert published.manifest.sha256 in str(e.value) and other.manifest.sha256 in str(e.value)
    # The same through the CLI: exit code 2 and one line naming both hashes.
    assert main(["audit", "seen", ckpt_dir, "--manifest", other.url]) == 2


def test_a_moved_manifest_names_the_checkpoints_hash_and_the_way_out(run, tmp_path):
    published, _ = run
    ckpt = read_checkpoint(write_meta(str(tmp_path / "moved"), published, step=5, data__manifest_url=str(tmp_path / "gone")))
    with pytest.raises(AuditError, match=f"trained on manifest {published.manifest.sha256} .*pass its new location with --manifest"):
        open_manifest(ckpt)
    assert open_manifest(ckpt, published.url).manifest.sha256 == published.manifest.sha256


def test_a_seed_that_disagrees_with_the_job_config_is_refused(run, tmp_path):
    published, _ = run
    ckpt_dir = write_meta(str(tmp_path / "edited"), published, step=5, loader__seed=4)
    with pytest.raises(CheckpointError, match="loader.seed 4 differs from the job config's data.seed 3"):
        read_checkpoint(ckpt_dir)


def test_an_edit_that_does_not_recompute_the_self_hash_is_refused(run, tmp_path, capsys):
    published, ckpt_dir = run
    meta_path = os.path.join(ckpt_dir, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["loader"]["seed"] = meta["job"]["data"]["seed"] = 4  # consistent, but meta_sha256 is left as it was
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    with pytest.raises(CheckpointError, match="meta_sha256 .* does not match the file's content .*edited after"):
        read_checkpoint(ckpt_dir)
    assert main(["audit", "seen", ckpt_dir]) == 2
    assert "meta_sha256" in capsys.readouterr().err


def test_a_different_seed_gives_a_different_answer(run, tmp_path):
    """The audit's answer depends on the seed: auditing a seed-4 run with seed 3 would be wrong."""
    published, ckpt_dir = run
    other = write_meta(str(tmp_path / "seed4"), published, step=20, seed=4)
    a = consumed(published.manifest, read_checkpoint(ckpt_dir), (1, 2))
    b = consumed(published.manifest, read_checkpoint(other), (1, 2))
    assert list(zip(a.shard, a.row)) != list(zip(b.shard, b.row))


def test_find_checkpoint_from_run_dir_and_meta(run):
    published, ckpt_dir = run
    run_dir = os.path.dirname(os.path.dirname(ckpt_dir))
    write_meta(run_dir, published, step=4)
    assert read_checkpoint(run_dir).step == 20  # newest
    assert read_checkpoint(os.path.join(ckpt_dir, "meta.json")).path == ckpt_dir
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        read_checkpoint(os.path.join(run_dir, "nothing"))


def test_cli_seen_doc_outputs(run, tmp_path, capsys):
    published, ckpt_dir = run
    out, samples = str(tmp_path / "docs.parquet"), str(tmp_path / "samples.jsonl")
    assert main(["audit", "seen", ckpt_dir, "--steps", "1:2", "--out", out, "--samples-out", samples]) == 0
    text = capsys.readouterr().out
    assert "16 samples" in text and "hash matches the checkpoint" in text
    docs = pq.read_table(out)
    with open(samples) as f:
        rows = [json.loads(line) for line in f]
    assert [r["index"] for r in rows] == list(range(16))
    assert sorted(docs.column("doc_id").to_pylist()) == sorted({f"doc-{r['shard']}-{r['row']}" for r in rows})
    assert main(["audit", "seen", ckpt_dir, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 160
    doc = f"doc-{rows[0]['shard']}-{rows[0]['row']}"
    assert main(["audit", "doc", ckpt_dir, doc, "--steps", "1:2"]) == 0
    assert "step        1 rank    0 index            0" in capsys.readouterr().out
    later = consumed(published.manifest, read_checkpoint(ckpt_dir), (3, 3))  # first epoch: rows not in steps 1-2
    assert main(["audit", "doc", ckpt_dir, f"doc-{later.shard[0]}-{later.row[0]}", "--steps", "1:2"]) == 1
    assert "NOT seen (0 of 17 tokens)" in capsys.readouterr().out
    assert main(["audit", "seen", ckpt_dir, "--out", str(tmp_path / "x.csv")]) == 2
    assert "use a .parquet or .jsonl" in capsys.readouterr().err


def test_inconsistent_meta_is_refused_naming_the_fields(run, tmp_path):
    published, _ = run
    for extra, why in (({"loader__next_index": 41}, "loader.next_index 41 is not step 5 x global_batch 8 = 40"),
                       ({"data__manifest_sha256": "0" * 64}, "differs from data.manifest_sha256"),
                       ({"global_batch": 7, "loader__next_index": 35}, "global_batch 7 is not a positive multiple"),
                       ({"format": "other"}, "format is 'other'")):
        ckpt_dir = write_meta(str(tmp_path / str(len(why))), published, step=5, **extra)
        with pytest.raises(CheckpointError, match=why):
            read_checkpoint(ckpt_dir)


def test_steps_before_a_manifest_change_are_not_audited_against_the_new_manifest(run, tmp_path):
    published, _ = run
    change = {"step": 6, "from_sha256": "a" * 64, "from_url": "/old/v1", "to_sha256": published.manifest.sha256,
              "to_url": published.url}
    ckpt = read_checkpoint(write_meta(str(tmp_path / "changed"), published, step=20, manifest_changes=[change]))
    assert parse_steps(None, ckpt) == (7, 20)
    assert consumed(published.manifest, ckpt).index[0] == 6 * B
    with pytest.raises(AuditError, match=f"steps before 7 were trained on manifest {'a' * 64} \\(/old/v1\\)"):
        parse_steps("3:8", ckpt)


def test_window_order_uses_the_recorded_window(run, tmp_path):
    published, _ = run
    ckpt = read_checkpoint(write_meta(str(tmp_path / "w"), published, step=15, order="window",
                                      loader__window_shards=2))
    used = consumed(published.manifest, ckpt)
    shard, row = samples_at(published.manifest, "train", 3, "window", np.arange(120), 2)
    assert used.shard.tolist() == shard.tolist() and used.row.tolist() == row.tolist()
    default = samples_at(published.manifest, "train", 3, "window", np.arange(120))
    assert (shard.tolist(), row.tolist()) != (default[0].tolist(), default[1].tolist())  # the window matters


def test_ranks_follow_a_resume_at_another_world_size(run, tmp_path):
    published, _ = run
    run_dir = str(tmp_path / "elastic")
    first = write_meta(run_dir, published, step=5, world_size=2)
    second = write_meta(run_dir, published, step=10, world_size=4, resumed_from="/old/place/checkpoints/step-5")
    used = consumed(published.manifest, read_checkpoint(second))
    # Steps 1-5 ran on 2 ranks of 4 samples, steps 6-10 on 4 ranks of 2 (the path moved: found by name).
    assert used.rank.tolist() == [(i % B) // 4 for i in range(40)] + [(i % B) // 2 for i in range(40, 80)]
    shutil.rmtree(first)  # pruned: the world size of steps 1-5 is no longer known, and not guessed
    used = consumed(published.manifest, read_checkpoint(second))
    assert used.rank.tolist() == [-1] * 40 + [(i % B) // 2 for i in range(40, 80)]


def test_a_checkpoint_store_that_opens_only_with_its_options(run, capsys):
    """`audit` and `report` open a checkpoint dir on a store with --storage-option (the stores a command
    reads): a store that opens only with its ticket refuses them without it and answers with it."""
    import uuid

    from test_storage import _ticketed

    from gristmill.manifests.storage import FsspecStore, Store

    published, ckpt_dir = run
    _ticketed("gmckpt", "ok")
    try:
        url = f"gmckpt://run-{uuid.uuid4().hex[:8]}/checkpoints"
        store = Store.from_url(url, ticket="ok")
        for name in os.listdir(ckpt_dir):
            store.put(f"{url}/{os.path.basename(ckpt_dir)}/{name}", open(os.path.join(ckpt_dir, name), "rb").read())
        with pytest.raises(PermissionError, match="gmckpt"):
            main(["audit", "seen", url, "--json"])
        capsys.readouterr()
        assert main(["audit", "seen", url, "--json", "--storage-option", "ticket=ok"]) == 0
        assert json.loads(capsys.readouterr().out)["samples"] == 160
        assert main(["report", url, "--text", "--storage-option", "ticket=ok"]) == 0
        page = capsys.readouterr().out
        assert published.manifest.sha256 in page and "160" in page.replace(",", "")  # the audit's summary is in
    finally:
        FsspecStore.kinds.pop("gmckpt", None)
