"""The fuzzy-dedup stage on Ray: planted near-duplicates found, unrelated documents kept, same
result whatever the worker count, and the connected-components steps."""
import glob
import random


import numpy as np
import pytest

import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.pipeline.connected_components import large_star, small_star
from gristmill.pipeline.stages.fuzzy_dedup.config import FuzzyDedupConfig
from gristmill.pipeline.stages.fuzzy_dedup.stage import find_near_duplicates
from gristmill.pipeline.minhash import MinHasher, jaccard


def _vocab(rng, n=3000):
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(n)]


def _mutate(rng, words, vocab, n_changes):
    """Replace ``n_changes`` words at spread-out positions (each touches up to 5 shingles)."""
    out = list(words)
    for pos in rng.sample(range(len(out)), n_changes):
        out[pos] = rng.choice(vocab) + "x"  # "x" suffix: never equal to the word it replaces
    return out


def planted_corpus(seed=0, n_base=40, words=150):
    """Unrelated base documents, then copies of some of them with 1-3 words changed (Jaccard
    about 0.86-0.97) and copies of others with a fifth of the words changed (Jaccard < 0.6).
    Returns the rows and the planted (base_id, copy_id) pairs with their exact Jaccard."""
    rng = random.Random(seed)
    vocab = _vocab(rng)
    bases = [[rng.choice(vocab) for _ in range(words)] for _ in range(n_base)]
    rows = [{"id": f"base-{i}", "text": " ".join(w).capitalize() + ".", "source": "syn"} for i, w in enumerate(bases)]
    pairs = []
    for i, w in enumerate(bases):
        changes = (1, 2, 3)[i % 3] if i % 2 == 0 else words // 5
        copies = 2 if i % 10 == 0 else 1  # some clusters of three
        for c in range(copies):
            rows.append({"id": f"copy-{i}-{c}", "text": " ".join(_mutate(rng, w, vocab, changes)), "source": "syn"})
            pairs.append((f"base-{i}", f"copy-{i}-{c}"))
    rng.shuffle(rows[n_base:])  # copies come later in input order than every base
    for k, r in enumerate(rows):
        r["order"] = k
    rows.append({"id": "empty-1", "text": " ... ", "source": "syn", "order": len(rows)})
    rows.append({"id": "empty-2", "text": "", "source": "syn", "order": len(rows)})
    mh = MinHasher()
    text = {r["id"]: r["text"] for r in rows}
    sims = {p: jaccard(mh.shingles([text[p[0]]]).hashes, mh.shingles([text[p[1]]]).hashes) for p in pairs}
    return rows, sims


def _run(rows, cfg, work_dir, parts=1, overrides=None):
    """The stage over ``rows`` split into ``parts`` partition files, its tasks run in this
    process; ``overrides`` (id -> text) are an earlier stage's rewritten texts."""
    import json

    import pyarrow as pa

    from gristmill.pipeline.documents import OVERRIDE_SCHEMA, make_order
    from gristmill.pipeline.runner import SerialRunner
    from gristmill.pipeline.survivors import Survivors
    from helpers import write_part

    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir(str(work_dir))
    rows = sorted(rows, key=lambda r: r["order"])
    size = -(-len(rows) // parts)
    for p in range(parts):
        chunk = rows[p * size:(p + 1) * size]
        path = wd.docs(p)
        write_part(path, pa.schema([("id", pa.string()), ("order", pa.int64()), ("text", pa.string()),
                                    ("bytes", pa.int64()), ("part", pa.int32())]),
                   pa.table({"id": [r["id"] for r in chunk], "order": [make_order(p, i) for i in range(len(chunk))],
                             "text": [r["text"] for r in chunk], "bytes": [len(r["text"].encode()) for r in chunk],
                             "part": [p] * len(chunk)}))
        mine = [(r["id"], make_order(p, i)) for i, r in enumerate(chunk) if r["id"] in (overrides or {})]
        if overrides is not None:
            write_part(wd.overrides("quality", p), OVERRIDE_SCHEMA,
                       pa.table({"id": [i for i, _ in mine], "order": [o for _, o in mine], "part": [p] * len(mine),
                                 "text": [overrides[i] for i, _ in mine]}, schema=OVERRIDE_SCHEMA))
    survivors = Survivors(wd).after("quality", overrides=overrides is not None)
    _, detail = find_near_duplicates(SerialRunner(wd), survivors, list(range(parts)), cfg)
    removed_t = pa.concat_tables([pq.read_table(wd.removed("fuzzy_dedup", p)) for p in range(parts)])
    removed = sorted((r["id"], (d := json.loads(r["detail"]))["duplicate_of"], d["cluster"], r["reason"], round(d["similarity"], 9))
                     for r in removed_t.to_pylist())
    gone = {r[0] for r in removed}
    kept = sorted(r["id"] for r in rows if r["id"] not in gone)
    return kept, removed, detail


@pytest.fixture(scope="module")
def corpus():
    return planted_corpus()


@pytest.fixture(scope="module")
def one_worker(corpus, tmp_path_factory):
    cfg = FuzzyDedupConfig(batch_size=1000)
    return _run(corpus[0], cfg, tmp_path_factory.mktemp("fd1"))


@pytest.mark.slow
def test_recall_and_precision_on_planted_pairs(corpus, one_worker):
    rows, sims = corpus
    kept, removed, stats = one_worker
    dup_of = {r[0]: r[1] for r in removed}
    high = [p for p, s in sims.items() if s >= 0.85]
    low = [p for p, s in sims.items() if s < 0.6]
    assert len(high) >= 15 and len(low) >= 15  # the corpus plants both kinds
    recall = sum(dup_of.get(copy) == base for base, copy in high) / len(high)
    assert recall >= 0.95, (recall, [(p, sims[p]) for p in high if dup_of.get(p[1]) != p[0]])
    assert all(copy in kept for _, copy in low)
    # Survivor rule: the earliest document of each cluster is kept; every base is earliest.
    assert all(f"base-{i}" in kept for i in range(40))
    assert "empty-1" in kept and "empty-2" in kept  # documents without words resemble nothing
    assert len(kept) + len(removed) == len(rows)
    for rid, survivor, cluster, reason, sim in removed:
        assert cluster == survivor and reason == "near_duplicate"
        assert sim >= 0.8  # verified Jaccard at or above the threshold


@pytest.mark.slow
def test_report(corpus, one_worker):
    rows, _ = corpus
    kept, removed, stats = one_worker
    assert stats["documents_in"] == len(rows)
    assert stats["documents_removed"] == len(removed)
    # verify: true chooses for recall (lsh.recall_params): 21 x 6 at 0.8, miss rate at the threshold 0.0017
    assert (stats["lsh"]["bands"], stats["lsh"]["rows"], stats["lsh"]["num_perm"]) == (21, 6, 128)
    assert stats["lsh"]["design"] == "recall" and 0 < stats["lsh"]["miss_rate_at_threshold"] <= 0.002
    assert 0 < stats["lsh"]["false_positive_area"] < 0.3 and 0 < stats["lsh"]["false_negative_area"] < 1e-4
    sizes = {int(k): v for k, v in stats["cluster_sizes"].items()}
    assert sum((k - 1) * v for k, v in sizes.items()) == len(removed)
    assert sizes.get(3, 0) >= 1  # the planted three-document clusters
    assert stats["sample_pairs"] and all(p["similarity"] >= 0.8 for p in stats["sample_pairs"])
    import json

    json.dumps(stats)  # JSON-able


@pytest.mark.slow
def test_same_result_with_any_partitioning_and_batch_size(corpus, one_worker, tmp_path):
    cfg = FuzzyDedupConfig(batch_size=7)
    two = _run(corpus[0], cfg, tmp_path, parts=5)
    assert two[0] == one_worker[0] and two[1] == one_worker[1]
    assert two[2]["cluster_sizes"] == one_worker[2]["cluster_sizes"]


@pytest.mark.slow
def test_same_result_with_many_components_buckets(corpus, one_worker, tmp_path, monkeypatch):
    """Edges spread over many components/assign buckets (tasks) give the same removals and clusters."""
    from gristmill.pipeline import connected_components as cc

    monkeypatch.setattr(cc, "EDGES_PER_TASK", 8)  # ~100 directed edges -> a dozen buckets
    many = _run(corpus[0], FuzzyDedupConfig(batch_size=64), tmp_path, parts=3)
    assert many[0] == one_worker[0] and many[1] == one_worker[1]
    assert many[2]["cluster_sizes"] == one_worker[2]["cluster_sizes"]
    assert len(glob.glob(str(tmp_path / "fuzzy_dedup" / "assign" / "*.parquet"))) > 5


@pytest.mark.slow
def test_estimated_similarity_without_verification(corpus, tmp_path):
    rows, sims = corpus
    cfg = FuzzyDedupConfig(verify=False, bands=9, rows=13)
    kept, removed, stats = _run(rows, cfg, tmp_path)
    assert (stats["lsh"]["bands"], stats["lsh"]["rows"]) == (9, 13)
    dup_of = {r[0]: r[1] for r in removed}
    very_high = [p for p, s in sims.items() if s >= 0.93]
    assert very_high and all(dup_of.get(c) == b for b, c in very_high)
    assert all(0 <= r[4] <= 1 for r in removed)


def _components_in_memory(hi, lo):
    """Run the large-star / small-star steps in one partition (reference for the Ray version)."""
    e = {"hi": np.asarray(hi, np.int64), "lo": np.asarray(lo, np.int64)}
    for _ in range(50):
        ls = large_star({"u": np.concatenate([e["hi"], e["lo"]]), "v": np.concatenate([e["lo"], e["hi"]])})
        ss = small_star({"u": ls["hi"], "v": ls["lo"]})
        pairs = sorted(set(zip(ss["hi"].tolist(), ss["lo"].tolist())))
        if pairs == sorted(set(zip(e["hi"].tolist(), e["lo"].tolist()))):
            return dict(pairs)
        e = {"hi": np.array([p[0] for p in pairs], np.int64), "lo": np.array([p[1] for p in pairs], np.int64)}
    raise AssertionError("no convergence")


def _union_find(edges):
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    return {x: find(x) for x in parent if find(x) != x}


def test_star_steps_find_components_of_a_long_chain_and_random_graph():
    rng = np.random.default_rng(0)
    chain = [(i + 1, i) for i in range(0, 200)]  # a path: worst case for plain label propagation
    rand = [tuple(x) for x in rng.integers(0, 300, size=(250, 2)).tolist() if x[0] != x[1]]
    for edges in (chain, rand, chain[::-1] + rand):
        got = _components_in_memory([max(e) for e in edges], [min(e) for e in edges])
        assert got == _union_find(edges)


@pytest.mark.slow
def test_connected_components_over_files_matches_union_find(tmp_path):
    """Edge files in several buckets (tasks), a long chain included: the same components as union-find."""
    from gristmill.pipeline import connected_components as cc
    from gristmill.pipeline.runner import SerialRunner
    from gristmill.pipeline.workdir import WorkDir

    rng = np.random.default_rng(1)
    edges = [tuple(x) for x in rng.integers(0, 500, size=(400, 2)).tolist() if x[0] != x[1]]
    edges += [(1000 + i + 1, 1000 + i) for i in range(64)]
    wd = WorkDir(str(tmp_path))
    hi = np.array([max(e) for e in edges], np.int64)
    lo = np.array([min(e) for e in edges], np.int64)
    files = []
    for k in range(2):  # two input files, as two verify tasks would write
        f = wd.scratch("cc", "edges", str(k))
        sl = slice(k * len(hi) // 2, (k + 1) * len(hi) // 2)
        cc.write_edges(f, np.concatenate([hi[sl], lo[sl]]), np.concatenate([lo[sl], hi[sl]]), 3)
        files.append(f)
    star = cc.connected_components(SerialRunner(wd), wd, "cc", "cc", files, 3)
    t = pa.concat_tables([pq.read_table(f) for f in star])
    got = {u: v for u, v in zip(t.column("u").to_pylist(), t.column("v").to_pylist()) if v < u}
    assert got == _union_find(edges)


def test_config_errors_name_the_key():
    assert FuzzyDedupConfig.from_dict({"threshold": 0.7, "verify": False}).threshold == 0.7
    with pytest.raises(ValueError, match="fuzzy_dedup.treshold: expected one of the keys .*, got unknown key 'treshold'; "
                                         "did you mean 'threshold'"):
        FuzzyDedupConfig.from_dict({"treshold": 0.7})
    with pytest.raises(ValueError, match=r"fuzzy_dedup.threshold: expected a number in \(0, 1\), got 1.5"):
        FuzzyDedupConfig.from_dict({"threshold": 1.5})
    with pytest.raises(ValueError, match="fuzzy_dedup.num_perm: expected an integer >= 1, got '128'"):
        FuzzyDedupConfig.from_dict({"num_perm": "128"})
    with pytest.raises(ValueError, match="fuzzy_dedup: expected bands x rows to fit in num_perm=128, got bands x rows = 20 x 10"):
        FuzzyDedupConfig.from_dict({"bands": 20, "rows": 10})
    with pytest.raises(ValueError, match="both bands and rows"):
        FuzzyDedupConfig.from_dict({"bands": 20})
    with pytest.raises(ValueError, match="fuzzy_dedup.verify: expected true or false, got 'yes'"):
        FuzzyDedupConfig.from_dict({"verify": "yes"})


@pytest.mark.slow
def test_demo_corpus_planted_pairs(tmp_path):
    """The demo corpus's planted near-duplicates (truth/near_duplicates.jsonl) in 00-books."""
    import io
    import json

    import zstandard

    from gristmill.pipeline.demo_corpus import write_demo_corpus

    write_demo_corpus(str(tmp_path / "demo"))
    with open(tmp_path / "demo" / "corpus" / "00-books.jsonl.zst", "rb") as f:
        lines = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8").read().splitlines()
    rows = [{"id": f"00-books.jsonl.zst:{i}", "order": i, "text": json.loads(line)["text"]} for i, line in enumerate(lines)]
    with open(tmp_path / "demo" / "truth" / "near_duplicates.jsonl") as f:
        truth = [json.loads(line) for line in f]
    text = {r["id"]: r["text"] for r in rows}
    mh = MinHasher()
    for t in truth:  # the corpus's Jaccard is ours: same words, same 5-word shingles
        exact = jaccard(mh.shingles([text[t["a"]]]).hashes, mh.shingles([text[t["b"]]]).hashes)
        assert abs(exact - t["jaccard"]) < 1e-5, t
    kept, removed, stats = _run(rows, FuzzyDedupConfig(), tmp_path / "wd")
    dup_of = {r[0]: r[1] for r in removed}
    high = [t for t in truth if t["jaccard"] >= 0.85]
    low = [t for t in truth if t["jaccard"] < 0.6]
    assert len(high) >= 8 and len(low) >= 5
    recall = sum(dup_of.get(t["b"]) == t["a"] for t in high) / len(high)
    assert recall >= 0.95, [t for t in high if dup_of.get(t["b"]) != t["a"]]
    assert all(t["b"] in kept and t["a"] in kept for t in low)


@pytest.mark.slow
def test_no_near_duplicates_keeps_everything(tmp_path):
    rng = random.Random(5)
    vocab = _vocab(rng)
    rows = [{"id": f"d{i}", "order": i, "text": " ".join(rng.choice(vocab) for _ in range(60))} for i in range(12)]
    kept, removed, stats = _run(rows, FuzzyDedupConfig(), tmp_path)
    assert kept == sorted(r["id"] for r in rows) and removed == []
    assert stats["documents_removed"] == 0 and stats["cluster_sizes"] == {} and stats["sample_pairs"] == []


@pytest.mark.slow
def test_texts_rewritten_by_an_earlier_stage_are_compared_as_rewritten(tmp_path):
    rng = random.Random(6)
    vocab = _vocab(rng)
    page = " ".join(rng.choice(vocab) for _ in range(80))
    boiler = " ".join(rng.choice(vocab) for _ in range(80))  # lines C4's drop_lines took out of d1
    rows = [{"id": "d0", "order": 0, "text": page}, {"id": "d1", "order": 1, "text": page + "\n" + boiler}]
    assert _run(rows, FuzzyDedupConfig(), tmp_path / "raw")[1] == []
    kept, removed, _ = _run(rows, FuzzyDedupConfig(), tmp_path / "ov", overrides={"d1": page})
    assert kept == ["d0"] and [r[:2] for r in removed] == [("d1", "d0")]


# -- recall by design, bounded verification (issue 25) --------------------------------------------
def test_recall_params_meet_the_miss_rate_with_the_fewest_false_candidates():
    from gristmill.pipeline.lsh import false_positive_area, recall_params

    for t, n, miss in [(0.8, 128, 0.002), (0.7, 128, 0.01), (0.9, 64, 0.002)]:
        p = recall_params(t, n, miss)
        assert p.bands * p.rows <= n and p.miss_rate <= miss and p.design == "recall"
        assert abs(p.miss_rate - (1 - t ** p.rows) ** p.bands) < 1e-12
        # brute force: no (b, r) within the miss rate has a smaller false-positive area
        fits = [(false_positive_area(t, b, r), b, r) for r in range(1, n + 1) for b in range(1, n // r + 1)
                if (1 - t ** r) ** b <= miss]
        assert p.false_positive == pytest.approx(min(fits)[0])
    p = recall_params(0.8, 128)
    assert (p.bands, p.rows) == (21, 6) and p.collision_probability(0.85) > 0.9999
    assert p.to_dict()["miss_rate_at_threshold"] == p.miss_rate
    # unreachable: 2 permutations cannot miss a pair at 0.8 less than 0.04 of the time; the best is taken
    assert recall_params(0.8, 2, 0.001).miss_rate == pytest.approx(0.2 ** 2)
    with pytest.raises(ValueError, match="miss_rate"):
        recall_params(0.8, 128, 0.0)


def test_config_chooses_for_recall_only_when_verified():
    assert FuzzyDedupConfig().lsh().design == "recall"
    p = FuzzyDedupConfig(verify=False).lsh()
    assert (p.bands, p.rows, p.design) == (14, 9, "weights")  # every candidate is a merge: datasketch's search
    assert FuzzyDedupConfig(miss_rate=0.01).lsh().miss_rate <= 0.01
    assert (FuzzyDedupConfig(bands=14, rows=9).lsh().design) == "given"
    with pytest.raises(ValueError, match="fuzzy_dedup.miss_rate: expected"):
        FuzzyDedupConfig.from_dict({"miss_rate": 1.5})


def test_bucket_pairs_are_linear_in_the_bucket_and_reach_past_hard_negatives():
    from gristmill.pipeline.lsh import REPRESENTATIVES, bucket_pairs

    k = 200
    order = np.arange(k, dtype=np.int64)[::-1].copy()
    hi, lo = bucket_pairs(np.zeros(k, np.int32), np.full(k, 7, np.uint64), order)
    assert len(hi) <= (REPRESENTATIVES + 1) * k and (hi > lo).all()
    assert len(set(zip(hi.tolist(), lo.tolist()))) == len(hi)  # distinct
    assert {h for h in hi.tolist()} == set(range(1, k))  # every member but the earliest is paired
    # The first 5 members are hard negatives (dissimilar to everything); members 5.. are copies of
    # one text. Verified edges (copy-copy only) still join every copy: through the predecessor.
    sim = lambda a, b: a >= 5 and b >= 5  # noqa: E731
    hi, lo = bucket_pairs(np.zeros(20, np.int32), np.ones(20, np.uint64), np.arange(20, dtype=np.int64))
    edges = [(h, l_) for h, l_ in zip(hi.tolist(), lo.tolist()) if sim(h, l_)]
    assert _union_find(edges) == {c: 5 for c in range(6, 20)}
    # two bands, two buckets: pairs from both, one copy of a pair shared by both
    hi, lo = bucket_pairs(np.array([0, 0, 1, 1], np.int32), np.array([3, 3, 9, 9], np.uint64), np.array([0, 1, 0, 1]))
    assert list(zip(hi.tolist(), lo.tolist())) == [(1, 0)]


def _copies_corpus(n_copies, seed=3, words=200):
    """One text and ``n_copies`` near copies of it (2 words changed each: Jaccard ~0.9-0.95 with the
    original), plus a hard negative of it first in input order (a fifth of its words changed)."""
    rng = random.Random(seed)
    vocab = _vocab(rng)
    base = [rng.choice(vocab) for _ in range(words)]
    texts = [" ".join(_mutate(rng, base, vocab, words // 5)), " ".join(base)]
    texts += [" ".join(_mutate(rng, base, vocab, 2)) for _ in range(n_copies - 1)]
    return [{"id": f"d{i:03d}", "order": i, "text": t} for i, t in enumerate(texts)]


def test_a_200_copy_cluster_costs_linear_verifications_and_removes_every_copy(tmp_path):
    rows = _copies_corpus(200)
    kept, removed, stats = _run(rows, FuzzyDedupConfig(), tmp_path, parts=3)
    assert kept == ["d000", "d001"]  # the hard negative stands; the original survives its 199 copies
    assert len(removed) == 199 and {r[1] for r in removed} == {"d001"} and all(r[4] >= 0.8 for r in removed)
    assert stats["cluster_sizes"] == {"200": 1}
    # All pairs would be 201 * 200 / 2 = 20,100 verifications. Each member is paired with at most
    # REPRESENTATIVES + 1 members per band (a bound of 105 a document at 21 bands); measured: 18 a
    # document at 100, 200 and 400 copies (1,442, 3,626, 8,504 pairs), every pair a verified edge.
    assert stats["candidate_pairs"] <= 25 * len(rows), stats["candidate_pairs"]
    assert stats["pairs_linked"] == stats["candidate_pairs"]


def test_pair_jaccard_matches_the_set_definition_with_and_without_numba():
    from gristmill.pipeline.lsh import pair_jaccard

    rng = np.random.default_rng(4)
    sets = [np.unique(rng.integers(0, 60, size=rng.integers(0, 40)).astype(np.uint64)) for _ in range(30)]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sets])])
    values = np.concatenate(sets)
    a, b = rng.integers(0, 30, 200), rng.integers(0, 30, 200)
    want = [len(set(sets[i]) & set(sets[j])) / len(set(sets[i]) | set(sets[j])) if len(sets[i]) + len(sets[j]) else 0.0
            for i, j in zip(a, b)]
    for numba in (True, False):
        assert pair_jaccard(values, offsets, a, b, use_numba=numba).tolist() == pytest.approx(want)
    assert jaccard(sets[0], sets[1]) == pytest.approx(pair_jaccard(values, offsets, [0], [1])[0])
