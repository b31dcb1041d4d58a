"""Mixtures: `gristmill mix`, the mixture manifest, the interleave's bound, the loader over a
mixture (pure, resumable, independent of world size and workers), exhaustion, and the audit."""
from __future__ import annotations

import json
import os
from fractions import Fraction

import numpy as np
import pytest
import yaml

from helpers import write_checkpoint_meta
from gristmill.cli import main
from gristmill.errors import ConfigError
from gristmill.manifests import EditedManifestError, ManifestError, load_manifest
from gristmill.manifests.mixture import (MAX_PERIOD, MixtureError, MixtureManifest, PublishedMixture, apportion,
                                         load_data)
from gristmill.manifests.synthetic import build_synthetic


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Three datasets in one store: web (70 train rows), code (20), and short (seq_len 8)."""
    root = str(tmp_path_factory.mktemp("mix"))
    build_synthetic(root, dataset="web", shard_rows=(40, 30), val_rows=(8,), seed=1)
    build_synthetic(root, dataset="code", shard_rows=(20,), val_rows=(8,), seed=2)
    build_synthetic(root, dataset="short", seq_len=8, shard_rows=(20,), val_rows=(), seed=3)
    build_synthetic(root, dataset="othertok", vocab_size=256, shard_rows=(20,), val_rows=(), seed=4)
    return root


def mix_job(store, tmp_path, components, name="webcode"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "store": os.path.join(store, "store"), "components": components}))
    return str(path)


def publish(store, tmp_path, components, name="webcode", capsys=None) -> PublishedMixture:
    assert main(["mix", mix_job(store, tmp_path, components, name)]) == 0
    return load_data(os.path.join(store, "store", name))


WEB_CODE = [{"dataset": "web", "weight": 0.75}, {"dataset": "code", "weight": 0.25}]


# -- the manifest and `gristmill mix` -----------------------------------------------------------
def test_mix_publishes_a_content_hashed_versioned_mixture(store, tmp_path, capsys):
    path = mix_job(store, tmp_path, WEB_CODE)
    assert main(["mix", path]) == 0
    out = capsys.readouterr().out
    pub = load_data(os.path.join(store, "store", "webcode"))
    m = pub.manifest
    assert isinstance(m, MixtureManifest) and f"{pub.url}" in out and m.sha256 in out
    assert [(c.name, c.parts) for c in m.components] == [("web", 3), ("code", 1)] and m.period == 4
    # each component pinned by its manifest's hash, resolved from the store name at mix time
    for c, comp in zip(m.components, pub.components):
        assert c.sha256 == load_manifest(os.path.join(store, "store", c.name)).manifest.sha256 == comp.manifest.sha256
    # publishing the same content again is the same version; `latest` points at it
    assert main(["mix", path]) == 0
    assert open(os.path.join(store, "store", "webcode", "latest")).read().strip() == str(m.version)
    assert load_data(pub.url).manifest.sha256 == m.sha256
    # another weight is another version with another hash
    assert main(["mix", path, "--set", "components[0].weight=0.5"]) == 0
    newer = load_data(os.path.join(store, "store", "webcode")).manifest
    assert newer.version == m.version + 1 and newer.sha256 != m.sha256 and [c.parts for c in newer.components] == [2, 1]


def test_the_hash_ignores_where_components_are_and_refuses_an_edit(store, tmp_path):
    pub = publish(store, tmp_path, WEB_CODE, name="moved")
    d = json.loads(pub.manifest.to_json())
    d["locations"]["web"]["url"] = "/elsewhere/web/v1"  # moving a component keeps the mixture's identity
    assert MixtureManifest.from_dict(d).sha256 == pub.manifest.sha256
    d["components"][0]["parts"] = 2
    d["period"] = 3
    with pytest.raises(EditedManifestError, match="edited after publishing"):
        MixtureManifest.from_dict(d)


@pytest.mark.parametrize("components, message", [
    ([{"dataset": "web", "weight": 0}, {"dataset": "code", "weight": 1}], r"components\[0\]\.weight: expected a number > 0"),
    ([{"dataset": "web", "weight": -2}], r"components\[0\]\.weight: expected a number > 0"),
    ([{"dataset": "web", "weight": 1, "tokens": 100}], r"components\[0\]: expected exactly one of weight or tokens"),
    ([{"dataset": "web", "weight": 1}, {"dataset": "code", "tokens": 100}], r"components: expected every component with a weight"),
    ([{"dataset": "web", "weight": 1}, {"dataset": "nope", "weight": 1}], r"components\[1\]\.dataset: unknown component 'nope'"),
    ([{"dataset": "web", "weight": 1}, {"dataset": "short", "weight": 1}], r"component 'short' \(short\) has seq_len 8, the mixture 16"),
    ([{"dataset": "web", "weight": 1}, {"dataset": "othertok", "weight": 1}], r"component 'othertok' .* has tokenizer\.sha256"),
    ([{"dataset": "web", "weight": 1}, {"dataset": "web", "weight": 1}], r"a second component named 'web'"),
    ([{"dataset": "web", "weight": 1}, {"name": "web2", "dataset": "web", "weight": 1}],
     r"two components pin the same dataset manifest"),
    ([{"dataset": "code", "tokens": 16 * 21, "exhausted": "stop"}], r"more than its 20 train rows, with exhausted: stop"),
    ([{"dataset": "web", "weight": 1, "sha256": "0" * 64}], r"hash pinned by the caller"),
])
def test_a_bad_mixture_is_refused_with_a_specific_message(store, tmp_path, capsys, components, message):
    assert main(["mix", mix_job(store, tmp_path, components, name="bad")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gristmill mix: error: ")
    import re
    assert re.search(message, err), err
    assert not os.path.exists(os.path.join(store, "store", "bad"))


def test_print_config_and_the_config_error_shape(store, tmp_path, capsys):
    path = mix_job(store, tmp_path, WEB_CODE)
    assert main(["mix", path, "--print-config", "--set", "components[1].exhausted=stop"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["components"][1]["exhausted"] == "stop" and printed["components"][0]["dataset"] == "web"
    from gristmill.manifests.mix_config import load
    with pytest.raises(ConfigError, match=r"components\[0\]\.exhausted: expected one of repeat, stop, got 'later'"):
        load(path, ["components[0].exhausted=later"])


def test_dataset_tools_name_a_mixture_for_what_it_is(store, tmp_path):
    pub = publish(store, tmp_path, WEB_CODE, name="tools")
    with pytest.raises(ManifestError, match="this is a mixture manifest"):
        load_manifest(pub.url)


def test_apportion_is_exact_when_it_fits_and_rounds_beyond():
    assert apportion([Fraction(1, 3), Fraction(2, 3)]) == [1, 2]
    assert apportion([Fraction("0.7"), Fraction("0.2"), Fraction("0.1")]) == [7, 2, 1]
    parts = apportion([Fraction(1, 999_983), Fraction(1, 999_979), Fraction(1)])  # lcm too large: rounded
    assert sum(parts) == MAX_PERIOD and all(p >= 1 for p in parts)


# -- the interleave -------------------------------------------------------------------------------
MEGATRON_BEHIND = (7, 25, 1, 25, 1, 7)  # parts on which Megatron's rule falls more than one sample behind


def test_megatrons_largest_deficit_rule_can_fall_more_than_one_sample_behind():
    """Why the interleave is not that rule as it stands (docs/mixtures.md): serve the largest w_c n - x_c."""
    w = np.array(MEGATRON_BEHIND) / sum(MEGATRON_BEHIND)
    x, worst = np.zeros(len(w)), 0.0
    for n in range(1, 2 * sum(MEGATRON_BEHIND) + 1):
        x[np.argmax(w * n - x)] += 1
        worst = max(worst, float(np.abs(w * n - x).max()))
    assert worst > 1


def test_every_prefix_is_within_one_sample_of_its_share_and_every_window_within_two():
    from gristmill.loader.mixture import index_of, interleave

    rng = np.random.default_rng(0)
    for trial in range(60):
        parts = tuple(int(x) for x in rng.integers(1, 60, size=int(rng.integers(2, 8))))
        if trial == 0:
            parts = MEGATRON_BEHIND
        q = sum(parts)
        n = 3 * q + 7
        comp, k = interleave(parts, np.arange(n))
        counts = np.zeros((n + 1, len(parts)), np.int64)
        counts[np.arange(1, n + 1), comp] = 1
        counts = np.cumsum(counts, axis=0)
        w = np.array(parts) / q
        error = counts - np.arange(n + 1)[:, None] * w
        assert np.abs(error).max() < 1, (parts, np.abs(error).max())
        for length in (1, 2, q // 3 + 1, q + 5):
            window = counts[length:] - counts[:-length] - length * w
            assert np.abs(window).max() < 2
        assert (counts[q] == np.array(parts)).all()  # a whole period holds the parts exactly
        for c in range(len(parts)):
            mine = np.flatnonzero(comp == c)
            assert (k[mine] == np.arange(mine.size)).all()  # the component's samples in order, none skipped
            assert index_of(parts, c, mine.size - 1) == mine[-1]


def test_the_interleave_at_a_far_index_needs_no_walk_from_zero():
    from gristmill.loader.mixture import interleave

    parts = (5, 3, 2)
    far = 10**15 + np.arange(20)
    comp, k = interleave(parts, far)
    near_comp, near_k = interleave(parts, far % 10)
    assert (comp == near_comp).all()
    assert (k == near_k + (far // 10) * np.array(parts)[comp]).all()


def test_manifest_show_summarises_a_mixture_and_json_is_the_whole_manifest(store, tmp_path, capsys):
    pub = publish(store, tmp_path, [{"dataset": "web", "weight": 0.75},
                                    {"dataset": "code", "weight": 0.25, "exhausted": "stop"}], name="shown")
    m = pub.manifest
    capsys.readouterr()
    assert main(["manifest", "show", pub.url]) == 0
    out = capsys.readouterr().out
    assert f"mixture      shown v{m.version}" in out and m.sha256 in out
    lines = {c.name: next(x for x in out.splitlines() if x.strip().startswith(c.name + " ")) for c in m.components}
    for c, comp in zip(m.components, pub.components):
        rows = sum(s.rows for s in comp.manifest.shards_of("train"))
        assert f"{c.dataset} v{comp.manifest.version} {c.sha256[:16]}" in lines[c.name]
        assert f"{rows:,} train rows ({rows * m.seq_len:,} tokens)" in lines[c.name]
        assert f"exhausted: {c.exhausted}" in lines[c.name] and f"weight {c.weight:g}" in lines[c.name]
    assert "3/4 = 75.0% of samples" in lines["web"] and "1/4 = 25.0% of samples" in lines["code"]
    assert main(["manifest", "show", pub.url, "--json"]) == 0
    assert MixtureManifest.from_json(capsys.readouterr().out, expected_sha256=m.sha256) == m


# -- the loader -----------------------------------------------------------------------------------
def served(url, tmp_path, *, batch=8, steps=None, world_size=1, rank=0, workers=0, start=0, **kw):
    from gristmill.loader import Loader
    from gristmill.loader.options import sections

    out = []
    with Loader(url, **sections(global_batch=batch, world_size=world_size, rank=rank, workers=workers, start_index=start,
                                cache_dir=str(tmp_path / "cache"), prefetch=2, **kw)) as ld:
        for i, b in enumerate(ld):
            out.append((b["indices"].numpy().copy(), b["tokens"].numpy().copy()))
            if steps is not None and i + 1 == steps:
                break
    return out


def rows_of(pub) -> list[np.ndarray]:
    """Every shard's rows, read directly from the store (no loader)."""
    from gristmill.manifests import read_rows

    return [read_rows(os.path.join(pub.url, s.path)) for s in pub.manifest.shards]


@pytest.mark.parametrize("order", ["global", "window", "sequential"])
def test_each_sample_is_the_row_its_component_order_names(store, tmp_path, order):
    from gristmill.loader.mixture import MixtureOrder

    pub = publish(store, tmp_path, WEB_CODE)
    batches = served(pub.url, tmp_path, steps=6, seed=4, order=order, window_shards=1, cache_limit_bytes=1 << 20)
    order = MixtureOrder(pub, "train", 4, order, window_shards=1)
    rows = [rows_of(c) for c in pub.components]
    for idx, tokens in batches:
        comp, _, shard, row = order.locate_components(idx)
        expected = np.stack([rows[c][s][r] for c, s, r in zip(comp, shard, row)])
        assert (tokens == expected).all()


def test_loader_bench_takes_a_mixture_url(store, tmp_path, capsys):
    pub = publish(store, tmp_path, WEB_CODE)
    capsys.readouterr()
    assert main(["loader", "bench", pub.url, "--steps", "3", "--step-ms", "0", "--latency-ms", "0",
                 "--global-batch", "8", "--json", "-"]) == 0
    passes = json.loads(capsys.readouterr().out)["passes"]
    assert [p["steps"] for p in passes] == [3, 3] and passes[0]["cache_misses"] == 3  # web's 2 shards, code's 1


def test_world_size_workers_and_resume_change_nothing(store, tmp_path):
    pub = publish(store, tmp_path, WEB_CODE)
    whole = served(pub.url, tmp_path, steps=8, seed=1)
    ref = np.concatenate([t for _, t in whole])
    halves = [served(pub.url, tmp_path, steps=8, seed=1, world_size=2, rank=r, workers=2) for r in (0, 1)]
    two = np.concatenate([np.concatenate([halves[0][s][1], halves[1][s][1]]) for s in range(8)])
    assert (two == ref).all()
    resumed = served(pub.url, tmp_path, steps=3, seed=1, start=5 * 8)
    assert (np.concatenate([t for _, t in resumed]) == ref[5 * 8:]).all()
    other = np.concatenate([t for _, t in served(pub.url, tmp_path, steps=8, seed=2)])
    assert not (other == ref).all()  # the seed matters


def test_repeat_serves_fresh_epochs_and_stop_ends_the_loader(store, tmp_path):
    from gristmill.loader.mixture import MixtureOrder

    rep = publish(store, tmp_path, WEB_CODE, name="rep")
    order = MixtureOrder(rep, "train", 0)
    assert order.num_samples is None  # every component repeats: endless
    comp, k, shard, row = order.locate_components(np.arange(4 * 20 * 3))
    code = np.flatnonzero(comp == 1)
    epochs = [row[code][e * 20:(e + 1) * 20] for e in range(3)]
    assert all(sorted(e.tolist()) == list(range(20)) for e in epochs)  # each epoch: every row once
    assert not (epochs[0] == epochs[1]).all()  # a fresh permutation

    stop = publish(store, tmp_path, [WEB_CODE[0], {**WEB_CODE[1], "exhausted": "stop"}], name="stop")
    end = MixtureOrder(stop, "train", 0).num_samples
    comp, _, _, _ = MixtureOrder(stop, "train", 0).locate_components(np.arange(end + 1))
    assert (comp[:end] == 1).sum() == 20 and comp[end] == 1  # index `end` would be code's 21st sample
    batches = served(stop.url, tmp_path, batch=8)
    assert len(batches) == end // 8  # the loader ends (StopIteration) before the first batch past the end


def test_token_budgets_end_the_mixture_at_the_budgets(store, tmp_path):
    from gristmill.loader.mixture import MixtureOrder

    pub = publish(store, tmp_path, [{"dataset": "web", "tokens": 16 * 90}, {"dataset": "code", "tokens": 16 * 30 - 5}],
                  name="budget")
    m = pub.manifest
    assert [c.budget_samples for c in m.components] == [90, 30] and [c.parts for c in m.components] == [3, 1]
    order = MixtureOrder(pub, "train", 0)
    assert order.num_samples == 120
    comp, _, _, _ = order.locate_components(np.arange(120))
    assert np.bincount(comp).tolist() == [90, 30]  # web repeats past its 70 rows; each budget exactly
    assert len(served(pub.url, tmp_path, batch=8)) == 15
    from gristmill.errors import UsageError
    with pytest.raises(UsageError, match="a mixture has no epochs"):
        served(pub.url, tmp_path, batch=8, epochs=2)


# -- checkpoints and the audit --------------------------------------------------------------------
def mixture_fields(pub) -> dict:
    """write_checkpoint_meta's overrides for the data fields the trainer records for a mixture."""
    from gristmill.trainer.meta import data_fields

    return {f"data__{k}": v for k, v in data_fields(pub).items()}


def test_meta_records_the_mixture_and_old_meta_still_reads(store, tmp_path):
    from gristmill.trainer.meta import CheckpointError, data_fields, read_meta

    pub = publish(store, tmp_path, WEB_CODE)
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), pub, step=5, **mixture_fields(pub))
    meta = read_meta(ckpt)
    assert meta["data"]["kind"] == "mixture" and meta["data"]["manifest_sha256"] == pub.manifest.sha256
    assert [c["sha256"] for c in meta["data"]["components"]] == [c.sha256 for c in pub.manifest.components]
    old = write_checkpoint_meta(str(tmp_path / "old"), pub.components[0], step=2)  # no data.kind: a dataset
    assert "kind" not in read_meta(old)["data"]
    bad = write_checkpoint_meta(str(tmp_path / "bad"), pub, step=5, data__kind="blend")
    with pytest.raises(CheckpointError, match="data.kind 'blend' is not one of dataset, mixture"):
        read_meta(bad)


def test_audit_seen_and_doc_across_components(store, tmp_path, capsys):
    from gristmill.trainer.meta import data_fields

    pub = publish(store, tmp_path, WEB_CODE)
    steps, B = 7, 8
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), pub, step=steps, global_batch=B, **mixture_fields(pub))
    capsys.readouterr()
    assert main(["audit", "seen", ckpt, "--json", "--samples-out", str(tmp_path / "s.jsonl")]) == 0
    s = json.loads(capsys.readouterr().out)
    n = steps * B  # 56 samples: 3/4 and 1/4 exactly, since 56 is a multiple of the period 4
    assert s["kind"] == "mixture" and s["samples"] == n
    assert {k: v["samples"] for k, v in s["by_component"].items()} == {"web": 42, "code": 14}
    assert s["by_component"]["code"]["share"] == 0.25
    assert s["by_component"]["web"]["tokens_seen"] == s["by_component"]["web"]["rows_seen"] * 17
    assert s["tokens_seen"] == sum(c["tokens_seen"] for c in s["by_component"].values())
    assert all(k.split("/")[0] in ("web", "code") for k in s["by_source"])
    lines = [json.loads(x) for x in open(tmp_path / "s.jsonl")]
    assert [x["index"] for x in lines] == list(range(n))
    assert sum(x["component"] == "code" for x in lines) == 14
    # a document is (component, id): an id both components hold names two documents, never one
    code_rows = [x for x in lines if x["component"] == "code"]
    doc = f"doc-0-{code_rows[0]['row']}"
    assert main(["audit", "doc", ckpt, doc, "--json"]) == 2
    assert f"ask for one of web/{doc}, code/{doc}" in capsys.readouterr().err
    assert main(["audit", "doc", ckpt, f"code/{doc}", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["component"] == "code" and d["provenance"]["component"] == "code" and d["seen"]
    assert d["tokens"] == 17 and d["provenance"]["dataset"] == "code"  # one row's document, not two added up
    assert {o["index"] for o in d["occurrences"]} == {x["index"] for x in code_rows if x["row"] == code_rows[0]["row"]}
    assert all(o["component"] == "code" for o in d["occurrences"])
    assert main(["audit", "seen", ckpt]) == 0
    text = capsys.readouterr().out
    assert "mixture" in text and "code" in text and "25.00%" in text


def test_audit_leak_checks_every_component_and_names_it(tmp_path, capsys):
    from test_audit_leak import build_text_dataset, words

    a, docs_a, _, _ = build_text_dataset(str(tmp_path / "a"), seed=1)
    b, docs_b, _, _ = build_text_dataset(str(tmp_path / "b"), seed=2)
    job = tmp_path / "mix.yaml"
    job.write_text(yaml.safe_dump({"name": "text2", "store": str(tmp_path / "mixstore"), "components": [
        {"dataset": a.url, "name": "a", "weight": 1}, {"dataset": b.url, "name": "b", "weight": 1}]}))
    assert main(["mix", str(job)]) == 0
    pub = load_data(str(tmp_path / "mixstore" / "text2"))
    rows_b = sum(s.rows for s in b.manifest.shards)
    steps = 2 * rows_b // 8  # every row of b, whatever the order
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), pub, step=steps, global_batch=8, **mixture_fields(pub))
    evals = tmp_path / "eval.jsonl"
    evals.write_text(json.dumps({"text": words(docs_b[3])}) + "\n" + json.dumps({"text": "w1 " * 20}) + "\n")
    capsys.readouterr()
    assert main(["audit", "leak", ckpt, "--eval", str(evals), "--json", "--out", str(tmp_path / "m.jsonl")]) == 1
    s = json.loads(capsys.readouterr().out)
    assert s["kind"] == "mixture" and s["items_leaked"] == 1 and s["leaked_items"] == ["0"]
    assert s["by_component"]["b"]["items_leaked"] == 1
    matches = [json.loads(x) for x in open(tmp_path / "m.jsonl")]
    assert {m["component"] for m in matches} >= {"b"} and all(m["item"] == "0" for m in matches)


def train_on_blend(tmp_path, steps: int, B: int, *sets: str, doc_tokens=None) -> tuple[str, str]:
    """Mix web and code 3:1 and train the tiny job on the mixture; returns (mixture URL, run dir)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, seed in (("web", 1), ("code", 2)):
        build_synthetic(str(tmp_path), dataset=name, vocab_size=64, shard_rows=(48, 40), val_rows=(16,), seed=seed,
                        tokens="counting", doc_tokens=doc_tokens)
    job = tmp_path / "mix.yaml"
    job.write_text(yaml.safe_dump({"name": "blend", "store": str(tmp_path / "store"), "components": [
        {"dataset": "web", "weight": 3}, {"dataset": "code", "weight": 1}]}))
    assert main(["mix", str(job)]) == 0
    mix_url, run_dir = str(tmp_path / "store" / "blend"), str(tmp_path / "run")
    cmd = [sys.executable, "-m", "gristmill.trainer", os.path.join(root, "configs", "train-tiny.yaml"),
           "--set", f"data.manifest={mix_url}", "--set", f"run.dir={run_dir}", "--set", f"run.steps={steps}",
           "--set", "checkpoint.every=3", "--set", "eval.every=3", "--set", f"data.global_batch={B}",
           "--set", "run.tensorboard=false", "--set", f"data.cache_dir={run_dir}-cache",
           "--set", "run.log_samples=true"]  # samples.jsonl: the check against the audit below
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=root, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return mix_url, run_dir


@pytest.mark.slow
def test_training_on_a_mixture_records_it_and_the_audit_counts_each_component_exactly(tmp_path, capsys):
    from gristmill.audit import read_checkpoint

    steps, B = 6, 8
    mix_url, run_dir = train_on_blend(tmp_path, steps, B)
    mixture = load_data(mix_url).manifest
    for step in (3, 6):
        ckpt = read_checkpoint(os.path.join(run_dir, "checkpoints", f"step-{step}"))
        assert ckpt.manifest_sha256 == mixture.sha256 and ckpt.meta["data"]["kind"] == "mixture"
        assert [c["sha256"] for c in ckpt.meta["data"]["components"]] == [c.sha256 for c in mixture.components]
        capsys.readouterr()
        assert main(["audit", "seen", ckpt.path, "--json", "--verify-checkpoint"]) == 0
        s = json.loads(capsys.readouterr().out)
        n = step * B  # a multiple of the period (4): the parts exactly
        assert {k: v["samples"] for k, v in s["by_component"].items()} == {"web": n * 3 // 4, "code": n // 4}
        assert {k: v["share"] for k, v in s["by_component"].items()} == {"web": 0.75, "code": 0.25}
        assert s["token_exposures"] == n * 17
    logged = [json.loads(line) for line in open(os.path.join(run_dir, "samples.jsonl"))]
    assert sorted(i for r in logged for i in r["indices"]) == list(range(steps * B))
    evals = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert any(r["kind"] == "eval" for r in evals)  # the validation pass read the components' validation splits


@pytest.mark.slow
def test_the_document_mask_trains_on_a_mixture(tmp_path):
    """model.document_mask=true on a mixture URL: the loader serves each row's boundaries from its component."""
    _, run_dir = train_on_blend(tmp_path, 3, 8, "model.document_mask=true", "eval.every=0", doc_tokens=(4, 12))
    with open(os.path.join(run_dir, "checkpoints", "step-3", "meta.json")) as f:
        assert json.load(f)["model_args"]["document_mask"] is True
    losses = [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))
              if json.loads(line)["kind"] == "train"]
    assert len(losses) == 3 and all(np.isfinite(losses))
