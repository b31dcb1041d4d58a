"""Dedup against published versions (issue 25), end to end through `gristmill prepare`: the kept
documents of v1 plus those of a run deduplicated against v1 equal the kept documents of one run
over both inputs, exact and near copies alike (the earlier document survives in both); the
removals name the earlier version and document; v1 is never touched; a corrupted dedup index is
refused like a forged shard; kill -9 and rerun reaches the same hash; v1 and v2 mix."""
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import yaml

pytestmark = pytest.mark.slow


def _vocab(rng, n=4000):
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(n)]


def _edit(words, k, vocab, rng):
    out = list(words)
    for pos in rng.sample(range(len(out)), k):
        out[pos] = rng.choice(vocab) + "z"
    return out


def _write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """old/ holds 60 documents; new/ 40: 6 exact copies of old ones (re-cased, re-spaced), 8 near
    copies of old ones (1 word changed: Jaccard ~0.93), a second near copy of one of those old
    ones (so the new run's own cluster of two goes with it), 4 documents at Jaccard ~0.55 of old
    ones (kept), 18 fresh documents and 3 near copies of fresh ones. The documents are fixed (one
    seed), so is every MinHash: the outcome is deterministic."""
    rng = random.Random(25)
    vocab = _vocab(rng)
    old = [[rng.choice(vocab) for _ in range(150)] for _ in range(60)]
    new, kinds = [], []
    for i in range(6):
        new.append(" ".join(old[i]).upper().replace(" ", "  ")), kinds.append(("exact", i))
    for i in range(6, 14):
        new.append(" ".join(_edit(old[i], 1, vocab, rng))), kinds.append(("near", i))
    new.append(" ".join(_edit(old[6], 1, vocab, rng))), kinds.append(("cluster", 6))
    for i in range(14, 18):
        new.append(" ".join(_edit(old[i], 8, vocab, rng))), kinds.append(("far", i))
    fresh = [[rng.choice(vocab) for _ in range(150)] for _ in range(18)]
    for w in fresh:
        new.append(" ".join(w)), kinds.append(("fresh", None))
    for w in fresh[:3]:
        new.append(" ".join(_edit(w, 2, vocab, rng))), kinds.append(("within", None))
    root = tmp_path_factory.mktemp("corpus")
    os.makedirs(root / "old"), os.makedirs(root / "new"), os.makedirs(root / "both")
    old_rows = [{"id": f"a{i:03d}", "text": " ".join(w)} for i, w in enumerate(old)]
    new_rows = [{"id": f"b{i:03d}", "text": t} for i, t in enumerate(new)]
    _write(root / "old" / "a.jsonl", old_rows)
    _write(root / "new" / "b.jsonl", new_rows)
    _write(root / "both" / "a.jsonl", old_rows)  # sorted input order: old first, so it survives
    _write(root / "both" / "b.jsonl", new_rows)
    return root, kinds


def _job(inputs, out, dataset, **over):
    d = {"inputs": [{"path": p, "id_field": "id"} for p in inputs],
         "output": {"store": str(out / "store"), "dataset": dataset, "report_html": False},
         "work_dir": str(out / "work"), "language": {"enabled": False}, "fuzzy_dedup": {},
         "split": {"validation_fraction": 0.0}, "tokenizer": {"vocab_size": 300, "sample_bytes": 200_000},
         "pack": {"seq_len": 64}, "runner": {"num_cpus": 2}}
    d.update(over)
    return d


def _prepare(job: dict, path, check=True):
    path.write_text(yaml.safe_dump(job))
    done = subprocess.run([sys.executable, "-m", "gristmill", "prepare", str(path)], capture_output=True, text=True,
                          timeout=300)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def _kept(url):
    from gristmill.manifests import load_manifest
    from gristmill.manifests.doc_index import read_published_doc_index

    return set(read_published_doc_index(load_manifest(url), columns=["doc_id"]).column("doc_id").to_pylist())


def _removed(out):
    (path,) = glob.glob(str(out / "work" / "*" / "removed.jsonl"))
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root, _ = corpus
    full_out, v1_out, v2_out = (tmp_path_factory.mktemp(n) for n in ("full", "v1", "v2"))
    _prepare(_job([str(root / "both" / "*.jsonl")], full_out, "full"), full_out / "job.yaml")
    _prepare(_job([str(root / "old" / "a.jsonl")], v1_out, "old"), v1_out / "job.yaml")
    v1_url = str(v1_out / "store" / "old" / "v1")
    job2 = _job([str(root / "new" / "b.jsonl")], v2_out, "new", dedup_against=[v1_url],
                tokenizer={"path": os.path.join(v1_url, "tokenizer.json")})  # one tokenizer: the versions mix
    _prepare(job2, v2_out / "job.yaml")
    return {"full": str(full_out / "store" / "full" / "v1"), "v1": v1_url, "v2": str(v2_out / "store" / "new" / "v1"),
            "v2_out": v2_out, "job2": job2}


def test_kept_of_v1_plus_the_incremental_run_equal_one_run_over_both(corpus, runs):
    _, kinds = corpus
    full, v1, v2 = _kept(runs["full"]), _kept(runs["v1"]), _kept(runs["v2"])
    assert v1 & v2 == set()
    assert v1 | v2 == full, (sorted(full - (v1 | v2)), sorted((v1 | v2) - full))
    assert len(v1) == 60  # the earlier documents survive in both
    gone = {f"b{i:03d}" for i, (k, _) in enumerate(kinds) if k in ("exact", "near", "cluster", "within")}
    assert gone and gone.isdisjoint(v2) and {f"b{i:03d}" for i, (k, _) in enumerate(kinds) if k == "far"} <= v2


def test_removals_name_the_earlier_version_and_document_and_v1_is_untouched(corpus, runs):
    from gristmill.manifests import load_manifest
    from gristmill.manifests.verify import verify_published

    _, kinds = corpus
    rows = {r["id"]: r for r in _removed(runs["v2_out"]) if r["stage"] == "dedup_against"}
    v1 = load_manifest(runs["v1"]).manifest
    for i, (kind, src) in enumerate(kinds):
        if kind in ("exact", "near"):
            r = rows[f"b{i:03d}"]
            d = json.loads(r["detail"]) if isinstance(r["detail"], str) else r["detail"]
            assert d["duplicate_of"] == f"a{src:03d}" and d["earlier_version"] == "old v1"
            assert d["earlier_sha256"] == v1.sha256
            assert r["reason"] == ("earlier_exact_duplicate" if kind == "exact" else "earlier_near_duplicate")
            assert (d["similarity"] == 1.0) if kind == "exact" else (0.8 <= d["similarity"] < 1.0)
    m2 = load_manifest(runs["v2"]).manifest
    assert [(p.dataset, p.version, p.sha256) for p in m2.dedup_against] == [("old", 1, v1.sha256)]
    # the second copy of old a006 went with the new run's own cluster (fuzzy dedup, before this stage)
    assert m2.stats["stages"]["dedup_against"]["removed"] == {"earlier_exact_duplicate": 6, "earlier_near_duplicate": 8}
    assert m2.stats["stages"]["fuzzy_dedup"]["removed"] == {"near_duplicate": 4}
    assert verify_published(load_manifest(runs["v1"])) == []  # v1's files as published
    assert len(v1.dedup_index) >= 1 and sum(f.rows for f in v1.dedup_index) == 60


def test_a_corrupted_dedup_index_is_refused_like_a_forged_shard(runs, tmp_path):
    import shutil

    v1_copy = tmp_path / "store" / "old" / "v1"
    shutil.copytree(runs["v1"], v1_copy)
    from gristmill.manifests import load_manifest
    from helpers import flip_byte

    ref = load_manifest(str(v1_copy)).manifest.dedup_index[0]
    flip_byte(str(v1_copy / ref.path))
    job = {**runs["job2"], "dedup_against": [str(v1_copy)], "work_dir": str(tmp_path / "work"),
           "output": {**runs["job2"]["output"], "store": str(tmp_path / "out")}}
    done = _prepare(job, tmp_path / "job.yaml", check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "sha256" in last and ref.path in last and "Traceback" not in done.stderr
    assert not glob.glob(str(tmp_path / "out" / "new" / "v*" / "manifest.json"))  # nothing published
    # pinned by the job to another manifest hash: refused before any work
    job["dedup_against"] = [{"url": runs["v1"], "sha256": "0" * 64}]
    done = _prepare(job, tmp_path / "job.yaml", check=False)
    assert done.returncode == 2 and "0" * 64 in done.stderr.strip().splitlines()[-1]


def test_kill_9_and_rerun_of_an_incremental_job_reaches_the_same_hash(runs, tmp_path):
    from gristmill.manifests import load_manifest

    want = load_manifest(runs["v2"]).manifest.sha256
    job = {**runs["job2"], "work_dir": str(tmp_path / "work"), "output": {**runs["job2"]["output"], "store": str(tmp_path / "s")}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    cmd = [sys.executable, "-m", "gristmill", "prepare", str(path)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not glob.glob(str(tmp_path / "work" / "*" / "_done" /
                                                                                   "dedup_against.candidates" / "*.json")):
        time.sleep(0.01)
    killed = proc.poll() is None
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert killed, "prepare finished before the kill point"
    assert not glob.glob(str(tmp_path / "s" / "new" / "v*" / "manifest.json"))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert load_manifest(str(tmp_path / "s" / "new")).manifest.sha256 == want


def test_v1_and_v2_mix_into_one_dataset(runs, tmp_path):
    """One dataset from the chain: each version stays a standalone manifest; `gristmill mix`
    pins both by hash (docs/fuzzy-dedup.md says why not a parent-linked manifest)."""
    from gristmill.manifests import load_manifest

    m1, m2 = load_manifest(runs["v1"]).manifest, load_manifest(runs["v2"]).manifest
    rows1, rows2 = (sum(s.rows for s in m.shards_of("train")) for m in (m1, m2))
    mix = {"name": "old-and-new", "store": str(tmp_path / "mixes"),
           "components": [{"dataset": runs["v1"].rsplit("/v1", 1)[0], "sha256": m1.sha256, "weight": rows1},
                          {"dataset": runs["v2"].rsplit("/v1", 1)[0], "sha256": m2.sha256, "weight": rows2}]}
    (tmp_path / "MIX.yaml").write_text(yaml.safe_dump(mix))
    done = subprocess.run([sys.executable, "-m", "gristmill", "mix", str(tmp_path / "MIX.yaml")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    from gristmill.manifests.mixture import load_either

    mixed = load_either(str(tmp_path / "mixes" / "old-and-new")).manifest
    assert [c.sha256 for c in mixed.components] == [m1.sha256, m2.sha256]


def test_the_earlier_document_is_read_back_from_its_version(corpus, runs):
    from gristmill.manifests import load_manifest
    from gristmill.pipeline.dedup_index import earlier_document_text

    root, _ = corpus
    with open(root / "old" / "a.jsonl") as f:
        text = {r["id"]: r["text"] for r in map(json.loads, f)}
    sha = load_manifest(runs["v1"]).manifest.sha256
    assert earlier_document_text(runs["v1"], sha, "a006") == text["a006"]  # decoded from v1's own tokens
    assert earlier_document_text(runs["v1"], sha, "b000") is None


def test_inspect_removed_shows_the_new_document_beside_the_earlier_one(corpus, runs):
    root, _ = corpus
    with open(root / "old" / "a.jsonl") as f:
        old = {r["id"]: r["text"] for r in map(json.loads, f)}
    work = glob.glob(str(runs["v2_out"] / "work" / "*"))[0]
    done = subprocess.run([sys.executable, "-m", "gristmill", "inspect", "removed", work, "--reason",
                           "earlier_near_duplicate", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    docs = json.loads(done.stdout)["documents"]
    assert docs and all(d["survivor"]["id"].startswith("old v1: a") for d in docs)
    for d in docs:
        assert d["survivor"]["text"] == old[d["survivor"]["id"].split(": ")[1]]  # read back from v1's tokens
