"""The takedown's finding and rebuilding (pipeline/takedown.py) on a synthetic version whose documents
run across rows and shards, with a dedup index made from texts by the pipeline's own MinHash: fast on
a local disk; the same through `gristmill takedown` on S3 (moto) is marked slow."""
import os
import random
from dataclasses import replace

import pytest
from helpers import doc_tokens

from gristmill.manifests import FileRef, ManifestStore, load_manifest
from gristmill.manifests import dedup_index as dx
from gristmill.manifests.doc_index import read_published_doc_index
from gristmill.manifests.hashing import sha256_file
from gristmill.manifests.synthetic import build_synthetic
from gristmill.manifests.verify import verify_published
from gristmill.pipeline.dedup_index import index_params, index_rows
from gristmill.pipeline.stages.fuzzy_dedup.config import FuzzyDedupConfig
from gristmill.pipeline.takedown import Request, find_documents, publish_without

SEQ = 16


def staged_with_index(root: str):
    """A staged synthetic version (documents of 10-40 tokens over 8 shards of 6 rows) plus a dedup index
    whose texts make doc-9 a 1-word edit of doc-5, doc-12 a 7% edit of it, doc-20 an exact copy of doc-3."""
    staged = build_synthetic(root, dataset="web", seq_len=SEQ, shard_rows=(6,) * 8, val_rows=(), doc_tokens=(10, 40),
                             tokens="random", publish=False)
    ids = sorted(set(read_published_doc_index(staged, columns=["doc_id"]).column("doc_id").to_pylist()))
    rng = random.Random(7)
    vocab = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(2000)]
    texts = {d: [rng.choice(vocab) for _ in range(150)] for d in ids}
    texts["doc-9"] = list(texts["doc-5"])
    texts["doc-9"][70] = "changed"
    texts["doc-12"] = [w if i % 14 else "other" for i, w in enumerate(texts["doc-5"])]  # 11 of 150 words
    texts["doc-20"] = list(texts["doc-3"])
    params = index_params(FuzzyDedupConfig())
    table = index_rows(params, ids, [" ".join(texts[d]) for d in ids])
    rel = "dedup_index/part-00000.parquet"
    dx.write(os.path.join(staged.url, rel), table.sort_by("doc_id"))
    sha, size = sha256_file(os.path.join(staged.url, rel))
    return replace(staged.manifest, dedup_index=(FileRef(rel, sha, size, table.num_rows),)), staged.url


def test_find_and_rebuild_keep_every_other_document_whole_and_the_version_valid(tmp_path):
    manifest, staging = staged_with_index(str(tmp_path / "build"))
    v1 = ManifestStore(str(tmp_path / "store")).publish(manifest, staging)
    found = find_documents(v1, Request(doc_ids=("doc-5", "doc-3", "no-such-doc")))
    assert {r["doc_id"]: r["match"] for r in found.removals.to_pylist()} == {
        "doc-5": "requested", "doc-9": "near copy", "doc-3": "requested", "doc-20": "exact copy"}
    assert found.not_found == ["id no-such-doc"] and found.threshold == 0.8
    rebuilt = publish_without(v1, found, Request(doc_ids=("doc-5", "doc-3"), reason="test"))
    v2 = rebuilt.published
    assert v2.manifest.version == 2 and verify_published(v2) == []
    spans = read_published_doc_index(v1, columns=["shard", "doc_id"]).to_pylist()
    holding = {v1.manifest.shards[s["shard"]].path for s in spans if s["doc_id"] in found.doc_ids}
    assert set(rebuilt.rewritten) | set(rebuilt.dropped) == holding and len(rebuilt.reused) == 8 - len(holding)
    t1, t2 = doc_tokens(v1), doc_tokens(v2)
    assert not set(t2) & set(found.doc_ids)
    for d, toks in t2.items():  # whole, or cut only at one end by a rewritten shard's partial row
        assert toks == t1[d] or t1[d][:len(toks)] == toks or t1[d][-len(toks):] == toks, d
    vanished = set(t1) - set(t2) - set(found.doc_ids)
    assert all(len(t1[d]) <= SEQ + 1 for d in vanished)  # only a piece shorter than the partial row it sat in
    dropped = sum(len(t1[d]) - len(t2.get(d, [])) for d in t1 if d not in found.doc_ids)
    assert dropped == rebuilt.tokens_dropped_tail and rebuilt.tokens_removed == sum(len(t1[d]) for d in found.doc_ids)
    # The dedup index lost exactly the removed rows, so a later dedup against v2 sees the rest.
    index, _ = dx.read_published(v2)
    assert set(index.column("doc_id").to_pylist()) == set(t1) - set(found.doc_ids)


def test_a_passage_finds_its_near_copies_and_the_hard_negative_stays(tmp_path):
    manifest, staging = staged_with_index(str(tmp_path / "build"))
    v1 = ManifestStore(str(tmp_path / "store")).publish(manifest, staging)
    index, params = dx.read_published(v1)
    # The passage is doc-5's text; the index only has sketches, so rebuild the text the fixture used.
    rng = random.Random(7)
    vocab = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(2000)]
    ids = sorted(index.column("doc_id").to_pylist())
    texts = {d: [rng.choice(vocab) for _ in range(150)] for d in ids}
    found = find_documents(v1, Request(texts=(" ".join(texts["doc-5"]).upper(),)))
    assert {r["doc_id"]: r["match"] for r in found.removals.to_pylist()} == {"doc-5": "exact copy", "doc-9": "near copy"}
    assert "doc-12" not in found.doc_ids


@pytest.mark.slow
def test_takedown_on_object_storage(tmp_path, s3, capsys):
    import json

    from gristmill.cli import main

    manifest, staging = staged_with_index(str(tmp_path / "build"))
    v1 = ManifestStore(f"{s3}/store").publish(manifest, staging)
    assert main(["takedown", v1.url, "--doc-id", "doc-5", "--json", "--report", str(tmp_path / "r.md")]) == 0
    report = json.loads(capsys.readouterr().out)
    new = report["versions"][0]["new"]
    assert new["url"] == f"{s3}/store/web/v2" and {d["doc_id"] for d in report["versions"][0]["removed"]} == {"doc-5", "doc-9"}
    assert main(["manifest", "verify", new["url"]]) == 0
    v2 = load_manifest(new["url"])
    assert v2.manifest.stats["takedown"]["parent"]["sha256"] == v1.manifest.sha256
    from gristmill.manifests.storage import Store

    assert not [p for p in Store.from_url(s3).listdir(f"{s3}/store/web") if ".takedown-" in p]  # staging removed
