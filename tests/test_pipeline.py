"""End to end on the demo corpus: accounting, planted truth, determinism, resume (kill -9 at every
stage: tests/test_kill_anywhere.py).

Every test here runs the whole pipeline on Ray, so all are marked slow (they still run in CI)."""
import glob
import json
import os

import pytest

from gristmill.manifests import load_manifest, read_doc_index, verify_published
from helpers import demo_job_dict

pytestmark = pytest.mark.slow


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from gristmill.pipeline.demo_corpus import write_demo_corpus

    out = tmp_path_factory.mktemp("demo")
    write_demo_corpus(str(out))
    return out


_job_dict = demo_job_dict


def _prepare(corpus, out, **over):
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import prepare

    return prepare(PrepareConfig.from_dict(_job_dict(corpus, out, **over)), quiet=True)


@pytest.fixture(scope="module")
def first_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run1")
    return _prepare(corpus, out), out


def test_accounting_and_planted_truth(corpus, first_run):
    result, _ = first_run
    acc = result.report["accounting"]
    assert acc["balanced"]
    assert acc["input"] == acc["kept"] + sum(acc["removed"].values()) + sum(acc["quarantined"].values())
    # every planted bad record is in quarantine, with its reason and provenance
    quarantined = _read_jsonl(os.path.join(result.run_dir, "quarantine.jsonl"))
    got = {(os.path.basename(q["source"]), q["position"] if q["reason"] != "truncated" else None, q["reason"]) for q in quarantined}
    want = {(b["source"], b["position"], b["reason"]) for b in _read_jsonl(corpus / "truth" / "bad_records.jsonl")}
    assert got == want
    removed = _read_jsonl(os.path.join(result.run_dir, "removed.jsonl"))
    dups = {r["id"]: json.loads(r["detail"])["duplicate_of"] for r in removed if r["reason"] == "exact_duplicate"}
    assert dups == {t["id"]: t["duplicate_of"] for t in _read_jsonl(corpus / "truth" / "exact_duplicates.jsonl")}
    lang_removed = {r["id"]: json.loads(r["detail"])["lang"] for r in removed if r["stage"] == "language"}
    for t in _read_jsonl(corpus / "truth" / "languages.jsonl"):
        assert lang_removed[t["id"]] == t["lang"]
    # planted near-duplicates and contaminated documents are untouched by these stages (fuzzy dedup's and decontam's job)
    planted = {p[k] for p in _read_jsonl(corpus / "truth" / "near_duplicates.jsonl") for k in ("a", "b")}
    planted |= {c["doc_id"] for c in _read_jsonl(corpus / "truth" / "contaminated.jsonl")}
    assert not planted & {r["id"] for r in removed}


def test_published_dataset_is_valid_and_splits_are_disjoint(first_run):
    result, _ = first_run
    pub = load_manifest(result.url)
    assert pub.manifest.sha256 == result.manifest_sha256
    assert verify_published(pub) == []
    m = pub.manifest
    assert m.shards_of("train") and m.shards_of("validation")
    st = m.stats["stages"]
    assert st["language"]["removed"]["language"] >= 12 and st["exact_dedup"]["removed"] == {"exact_duplicate": 6}
    assert st["tokenize"]["documents_out"] == m.stats["accounting"]["kept"]
    assert st["pack"]["tokens_out"] == sum(s.tokens for s in m.shards)
    index = read_doc_index(os.path.join(result.url, m.doc_index.path)).to_pylist()
    split_of_shard = [s.split for s in m.shards]
    by_split = {"train": set(), "validation": set()}
    for span in index:
        by_split[split_of_shard[span["shard"]]].add(span["doc_id"])
    assert by_split["train"] and by_split["validation"] and not by_split["train"] & by_split["validation"]
    # provenance: a WARC page's WARC-Target-URI is its url; inputs without one have none
    urls = {span["source"].rsplit("/", 1)[-1]: span["url"] for span in index}
    assert urls["06-web.warc.gz"].startswith("https://example.org/page/") and urls["00-books.jsonl.zst"] is None
    assert {i.uri.rsplit("/", 1)[-1] for i in m.inputs} >= {"00-books.jsonl.zst", "06-web.warc.gz"}


def test_same_hash_whatever_the_parallelism_batch_sizes_and_partitioning(corpus, first_run, tmp_path):
    result, _ = first_run
    # partition_bytes=1: one partition per file (27) instead of the default grouping (1 here)
    other = _prepare(corpus, tmp_path, runner={"concurrency": 1}, partitioning={"records_per_batch": 7, "partition_bytes": 1})
    assert len(glob.glob(os.path.join(other.run_dir, "docs", "*.parquet"))) == 27
    assert len(glob.glob(os.path.join(result.run_dir, "docs", "*.parquet"))) < 27
    assert other.manifest_sha256 == result.manifest_sha256


def test_rerun_skips_finished_work(corpus, first_run):
    result, out = first_run
    again = _prepare(corpus, out)
    assert again.manifest_sha256 == result.manifest_sha256 and again.version == result.version
    resumed = {r["stage"]: r.get("resumed_parts") for r in again.report["stages"]}
    assert resumed["extract"] == resumed["tokenize"] == len(glob.glob(os.path.join(result.run_dir, "docs", "*.parquet")))


def test_same_shards_with_tokenizers_as_with_tiktoken(corpus, first_run, tmp_path):
    """The fast encoder (tiktoken over the trained BPE's rank table) and HF tokenizers write the same
    shards and document index; the manifest records which one ran (and so differs only there)."""
    result, _ = first_run
    fast = load_manifest(result.url).manifest
    assert fast.tokenizer.encoder.startswith("tiktoken ")
    other = _prepare(corpus, tmp_path, tokenizer={**_job_dict(corpus, tmp_path)["tokenizer"], "encoder": "tokenizers"})
    slow = load_manifest(other.url).manifest
    assert slow.tokenizer.encoder.startswith("tokenizers ")
    assert [(s.path, s.sha256, s.raw_sha256) for s in slow.shards] == [(s.path, s.sha256, s.raw_sha256) for s in fast.shards]
    assert slow.doc_index.sha256 == fast.doc_index.sha256 and slow.config == fast.config
