"""`gristmill takedown` on a version made by `gristmill prepare` without fuzzy dedup: a requested
document goes with its 1-word edit (a near copy the run kept) but not with a 7% edit (a hard
negative); the new version verifies, names its parent and what was removed, keeps every untouched
shard byte for byte; `--runs` lists exactly the checkpoints and steps an independent replay of the
loader order finds; a mixture is re-pinned."""
import json
import os
import random
import subprocess
import sys

import pytest
import yaml
from helpers import doc_tokens, write_checkpoint_meta

from gristmill.cli import main
from gristmill.loader.order import samples_at
from gristmill.manifests import load_manifest
from gristmill.manifests.doc_index import read_published_doc_index
from gristmill.manifests.mixture import load_data
from gristmill.trainer import skips

pytestmark = pytest.mark.slow

B = 8


def _edit(words, k, vocab, rng):
    out = list(words)
    for pos in rng.sample(range(len(out)), k):
        out[pos] = rng.choice(vocab) + "q"
    return out


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    """50 documents of 150 words; t010 is the one asked for, t030 its 1-word edit (Jaccard ~0.93),
    t040 an edit of 11 words (7%: Jaccard ~0.5, a hard negative). Fuzzy dedup off: all three kept."""
    rng = random.Random(42)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(3000)]
    docs = [[rng.choice(vocab) for _ in range(150)] for _ in range(50)]
    docs[30] = _edit(docs[10], 1, vocab, rng)
    docs[40] = _edit(docs[10], 11, vocab, rng)
    root = tmp_path_factory.mktemp("takedown")
    with open(root / "in.jsonl", "w") as f:
        for i, w in enumerate(docs):
            f.write(json.dumps({"id": f"t{i:03d}", "text": " ".join(w), "url": f"https://example.org/page/{i}"}) + "\n")
    job = {"inputs": [{"path": str(root / "in.jsonl"), "id_field": "id"}],
           "output": {"store": str(root / "store"), "dataset": "web", "report_html": False},
           "work_dir": str(root / "work"), "language": {"enabled": False}, "fuzzy_dedup": {"enabled": False},
           "split": {"validation_fraction": 0.0}, "tokenizer": {"vocab_size": 300, "sample_bytes": 200_000},
           "pack": {"seq_len": 64, "shard_bytes": 1500}, "runner": {"num_cpus": 1}}
    (root / "job.yaml").write_text(yaml.safe_dump(job))
    done = subprocess.run([sys.executable, "-m", "gristmill", "prepare", str(root / "job.yaml")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, str(root / "store" / "web" / "v1")


def _ids(url):
    return set(read_published_doc_index(load_manifest(url), columns=["doc_id"]).column("doc_id").to_pylist())


def _replay(url, run_dirs, removed):
    """Independent of the audit: each checkpoint's steps walked one by one from meta.json (skips as
    trainer/skips.py defines them), mapped by loader.order.samples_at, joined with the doc index."""
    pub = load_manifest(url)
    spans = read_published_doc_index(pub, columns=["shard", "row", "doc_id"]).to_pylist()
    where = {}
    for s in spans:
        if s["doc_id"] in removed:
            where.setdefault((s["shard"], s["row"]), set()).add(s["doc_id"])
    out = {}
    for run in run_dirs:
        for name in sorted(os.listdir(os.path.join(run, "checkpoints"))):
            with open(os.path.join(run, "checkpoints", name, "meta.json")) as f:
                meta = json.load(f)
            index, shift = 0, 0
            found = {}
            for step in range(1, meta["step"] + 1):
                for r in meta["skips"]:
                    if r["kind"] == "rewind" and r["after_step"] == step - 1:
                        index += r["end"] - r["start"]
                batch = list(range(index, index + B))
                index += B
                if any(r["kind"] == "bad_step" and r["step"] == step for r in meta["skips"]):
                    continue
                shard, row = samples_at(pub.manifest, "train", meta["loader"]["seed"], "global", batch)
                for key in zip(shard.tolist(), row.tolist()):
                    for d in where.get(key, ()):
                        found.setdefault(d, set()).add(step)
            out[os.path.join(run, "checkpoints", name)] = {d: sorted(s) for d, s in found.items()}
    return out


def test_takedown_by_id_removes_near_copies_and_publishes_a_cheap_verified_version(version, tmp_path, capsys):
    root, v1 = version
    before = _ids(v1)
    assert {"t010", "t030", "t040"} <= before
    # Two runs trained on v1 (meta.json only: the audit reads nothing else): a plain one, and one with a
    # rewind past a spike and a bad step, so the answer must honour skips.
    plain = str(tmp_path / "plain")
    for step in (6, 12):
        write_checkpoint_meta(plain, load_manifest(v1), step=step, world_size=1)
    spiky = str(tmp_path / "spiky")
    recs = [skips.record("rewind", 32, 48, 6, "loss spike", after_step=4),
            skips.record("bad_step", 9 * B + 16 - B, 9 * B + 16, 9, "non-finite")]
    write_checkpoint_meta(spiky, load_manifest(v1), step=4, world_size=1)
    write_checkpoint_meta(spiky, load_manifest(v1), step=10, world_size=1, skips=recs,
                          loader__next_index=skips.next_index(10, B, recs))

    report_path = str(tmp_path / "td.md")
    assert main(["takedown", v1, "--doc-id", "t010", "--reason", "GDPR Art. 17 request 7", "--runs", plain, spiky,
                 "--report", report_path]) == 0
    out = capsys.readouterr().out
    v2 = str(root / "store" / "web" / "v2")
    after = _ids(v2)
    assert before - after == {"t010", "t030"}  # the document and its 1-word edit; the 7% edit stays
    with open(report_path[:-3] + ".json") as f:
        report = json.load(f)
    removed = {d["doc_id"]: d for d in report["versions"][0]["removed"]}
    assert removed["t010"]["match"] == "requested" and removed["t030"]["match"] == "near copy"
    assert removed["t030"]["similarity"] >= 0.8 and removed["t030"]["url"] == "https://example.org/page/30"
    kept = {k["doc_id"]: k["similarity"] for k in report["versions"][0]["kept_below_threshold"]}
    assert kept.keys() <= {"t040"} and all(v < 0.8 for v in kept.values())  # the hard negative: shown, not removed

    # The new version verifies, names its parent and the removals, and reuses every other shard as is.
    assert main(["manifest", "verify", v2]) == 0
    m1, m2 = load_manifest(v1).manifest, load_manifest(v2).manifest
    record = m2.stats["takedown"]
    assert record["parent"]["sha256"] == m1.sha256 and record["parent"]["version"] == 1
    assert sorted(r["doc_id"] for r in record["removed"]) == ["t010", "t030"]
    assert record["request"]["reason"] == "GDPR Art. 17 request 7"
    held = {s["shard"] for s in read_published_doc_index(load_manifest(v1), columns=["shard", "doc_id"]).to_pylist()
            if s["doc_id"] in ("t010", "t030")}
    rewritten = {m1.shards[i].path for i in held}
    assert set(record["shards_rewritten"]) | set(record["shards_dropped"]) == rewritten
    unchanged = [s for s in m1.shards if s.path not in rewritten]
    assert unchanged and len(unchanged) == record["shards_reused"]
    new_by_path = {s.path: s for s in m2.shards}
    for s in unchanged:
        with open(os.path.join(v1, s.path), "rb") as a, open(os.path.join(v2, s.path), "rb") as b:
            assert a.read() == b.read()
        assert new_by_path[s.path] == s
    # Every kept document keeps its tokens, but for a rewritten shard's partial row: dropped from the start
    # of a document that goes on into the next shard, else from the end; never a hole in a document.
    t1, t2 = doc_tokens(load_manifest(v1)), doc_tokens(load_manifest(v2))
    cut = [d for d in t2 if t2[d] != t1[d]]
    assert all(t1[d][:len(t2[d])] == t2[d] or t1[d][-len(t2[d]):] == t2[d] for d in cut)
    assert len(cut) <= len(rewritten) and set(t1) - set(t2) == {"t010", "t030"}

    # --runs: exactly what the independent replay finds, checkpoint by checkpoint.
    expected = _replay(v1, [plain, spiky], {"t010", "t030"})
    got = {e["checkpoint"]: e["documents"] for e in report["runs"]}
    assert got == expected and any(expected.values())
    assert "trained on t0" in out and "GDPR Art. 17 request 7" in open(report_path).read()


def test_takedown_by_url_and_text_dry_run_and_mixture_repin(version, tmp_path, capsys):
    root, v1 = version
    texts = {}
    with open(root / "in.jsonl") as f:
        for line in f:
            r = json.loads(line)
            texts[r["id"]] = r["text"]
    requests = tmp_path / "requests.txt"
    requests.write_text("# one a line\nhttps://example.org/page/7\ntext " + texts["t020"].upper() + "\n")
    assert main(["takedown", v1, "--from-file", str(requests), "--dry-run", "--json",
                 "--report", str(tmp_path / "dry.md")]) == 0
    report = json.loads(capsys.readouterr().out)
    got = {d["doc_id"]: d["match"] for d in report["versions"][0]["removed"]}
    assert got == {"t007": "requested", "t020": "exact copy"}  # the text re-cased: the same normalised text
    assert report["versions"][0]["new"] is None and not os.path.exists(root / "store" / "web" / "v3")

    mix_job = tmp_path / "mix.yaml"
    mix_job.write_text(yaml.safe_dump({"name": "blend", "store": str(root / "store"),
                                       "components": [{"dataset": v1, "weight": 1.0}]}))
    assert main(["mix", str(mix_job)]) == 0
    mixture = str(root / "store" / "blend" / "v1")
    capsys.readouterr()
    assert main(["takedown", mixture, "--doc-id", "t007", "--json", "--report", str(tmp_path / "mix.md")]) == 0
    report = json.loads(capsys.readouterr().out)
    new_component = report["versions"][0]["new"]
    assert report["mixtures"][0]["new"]["version"] == 2
    repinned = load_data(report["mixtures"][0]["new"]["url"])
    assert repinned.manifest.components[0].sha256 == new_component["sha256"]
    assert "t007" not in _ids(new_component["url"])
