"""The dedup index (issue 25): its rows from real MinHash, matching new documents against it, and
the file pinned by the manifest like a shard (a corrupted or forged index is refused)."""
import json
import os
import random

import numpy as np
from helpers import write_part
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import flip_byte, write_tokenizer

from gristmill.manifests import ManifestStore
from gristmill.manifests import dedup_index as dx
from gristmill.manifests.builder import DatasetBuilder
from gristmill.manifests.errors import FactMismatchError, HashMismatchError, ManifestError
from gristmill.manifests.manifest import Input, Manifest
from gristmill.manifests.verify import verify_published
from gristmill.pipeline import dedup_index as di
from gristmill.pipeline.stages.fuzzy_dedup.config import FuzzyDedupConfig
from gristmill.pipeline.minhash import MinHasher, jaccard

PARAMS = di.index_params(FuzzyDedupConfig())


def _texts(seed=0, n=30, words=200):
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(3000)]
    return [" ".join(rng.choice(vocab) for _ in range(words)) for _ in range(n)], vocab, rng


def _edit(text, k, vocab, rng):
    w = text.split()
    for pos in rng.sample(range(len(w)), k):
        w[pos] = rng.choice(vocab) + "q"
    return " ".join(w)


def test_sketch_estimate_tracks_exact_jaccard():
    texts, vocab, rng = _texts()
    mh = MinHasher()
    pairs = [(t, _edit(t, k, vocab, rng)) for t, k in zip(texts, [1, 2, 3, 5, 8, 12, 20, 40] * 4)]
    sk, _ = di.sketch_texts([x for p in pairs for x in p], PARAMS)
    est = dx.estimate(sk[0::2], sk[1::2], PARAMS)
    exact = np.array([jaccard(np.unique(mh.shingles([a]).hashes), np.unique(mh.shingles([b]).hashes)) for a, b in pairs])
    assert np.abs(est - exact).max() < 0.15 and np.abs(est - exact).mean() < 0.05
    unrelated = dx.estimate(sk[0:20:2], sk[2:22:2], PARAMS)
    assert unrelated.max() < 0.15
    assert dx.estimate(sk[:1], sk[:1], PARAMS)[0] == 1.0
    # 4-bit values, two a byte: unpacked they are the signature's low bits
    mh = MinHasher()
    sig = mh.signatures_of(mh.shingles([pairs[0][0]]))
    n = PARAMS["bands"] * PARAMS["rows"]
    assert PARAMS["bits"] == 4 and sk.shape[1] == n // 2
    assert dx.values(sk[:1], PARAMS)[0].tolist() == (sig[0, :n] & 15).tolist()
    p8 = {**PARAMS, "bits": 8}
    assert dx.values(dx.sketches(sig, p8), p8)[0].tolist() == (sig[0, :n] & 255).tolist()
    # band keys: a band's values as one integer, equal where the values are
    keys = dx.sketch_band_keys(sk[:4], PARAMS)
    assert keys.shape == (4, PARAMS["bands"])
    v0 = (sig[0, : PARAMS["rows"]] & 15).tolist()
    assert int(keys[0, 0]) == sum(v << (4 * (PARAMS["rows"] - 1 - j)) for j, v in enumerate(v0))


def test_match_finds_exact_and_near_copies_and_nothing_else():
    texts, vocab, rng = _texts(1)
    old = texts[:20]
    index = di.index_rows(PARAMS, [f"old-{i}" for i in range(20)], old)
    new = [old[3], "  " + old[4].upper() + " !", _edit(old[5], 2, vocab, rng), _edit(old[6], 60, vocab, rng),
           texts[25], "...", old[3]]
    sk, has = di.sketch_texts(new, PARAMS)
    from gristmill.pipeline.documents import norm_hash

    m = di.match(PARAMS, 0.8, dx.exact_keys([norm_hash(t) for t in new]), sk, has, index)
    assert m["row"].tolist() == [3, 4, 5, -1, -1, -1, 3]
    assert m["kind"].tolist() == ["exact", "exact", "near", "", "", "", "exact"]
    assert m["similarity"][2] >= 0.8 and m["similarity"][0] == 1.0
    # empty index: nothing matches
    assert (di.match(PARAMS, 0.8, dx.exact_keys([norm_hash(t) for t in new]), sk, has, index.slice(0, 0))["row"] == -1).all()


def test_params_that_differ_are_refused_by_name():
    from gristmill.errors import ConfigError

    with pytest.raises(ConfigError, match=r"fuzzy_dedup.ngram: 3 differs from the dedup index of v1 \(5\)"):
        di.check_comparable(di.index_params(FuzzyDedupConfig(ngram=3)), PARAMS, "v1")
    di.check_comparable(di.index_params(FuzzyDedupConfig()), PARAMS, "v1")
    with pytest.raises(ManifestError, match="bands x rows <= num_perm"):
        dx.schema({**PARAMS, "bands": 100})
    with pytest.raises(ManifestError, match=r"bits one of \(4, 8\)"):
        dx.schema({**PARAMS, "bits": 5})


def _publish(root, with_index=True, texts=None):
    texts = texts or _texts(2, n=12)[0]
    tok = write_tokenizer(os.path.join(root, "tok.json"), 64)
    b = DatasetBuilder(os.path.join(root, "staging"), dataset="idx", seq_len=8, tokenizer_json=tok, vocab_size=64, eos_id=0)
    b.add_shard("train", np.arange(len(texts) * 9, dtype=np.int64).reshape(len(texts), 9) % 64)
    b.set_doc_index(pa.table({"shard": pa.array([0] * len(texts), pa.int32()), "row": pa.array(range(len(texts)), pa.int64()),
                              "start": pa.array([0] * len(texts), pa.int32()), "length": pa.array([9] * len(texts), pa.int32()),
                              "doc_id": [f"d{i}" for i in range(len(texts))], "source": ["x"] * len(texts),
                              "position": pa.array(range(len(texts)), pa.int64()), "lang": ["en"] * len(texts)}))
    if with_index:
        b.add_dedup_index(di.index_rows(PARAMS, [f"d{i}" for i in range(6)], texts[:6]))
        b.add_dedup_index(di.index_rows(PARAMS, [f"d{i}" for i in range(6, len(texts))], texts[6:]))
    m = b.manifest(inputs=[Input("x", 1, "0" * 64)], config={}, code_version="t", stats={})
    return ManifestStore(os.path.join(root, "store")).publish(m, b.dir), texts


def test_published_index_round_trips_and_verifies(tmp_path):
    pub, texts = _publish(str(tmp_path))
    assert [f.path for f in pub.manifest.dedup_index] == ["dedup_index/part-00000.parquet", "dedup_index/part-00001.parquet"]
    assert [f.rows for f in pub.manifest.dedup_index] == [6, 6]
    t, params = dx.read_published(pub)
    assert params == PARAMS and t.column("doc_id").to_pylist() == sorted([f"d{i}" for i in range(6)]) + sorted(
        [f"d{i}" for i in range(6, 12)])  # each file sorted by doc_id
    assert verify_published(pub) == []
    # the manifest's JSON names the files, and reads back with the same hash
    d = json.loads(pub.manifest.to_json())
    assert len(d["dedup_index"]) == 2
    assert Manifest.from_dict(d).sha256 == pub.manifest.sha256
    # the index bytes are a function of the rows: written again, the same hash
    again = os.path.join(str(tmp_path), "again.parquet")
    dx.write(again, di.index_rows(PARAMS, [f"d{i}" for i in range(6)], texts[:6]))
    with open(again, "rb") as f:
        from gristmill.manifests.hashing import sha256_bytes

        assert sha256_bytes(f.read()) == pub.manifest.dedup_index[0].sha256


def test_a_manifest_without_an_index_keeps_its_hash_and_is_refused_as_a_base(tmp_path):
    pub, _ = _publish(str(tmp_path), with_index=False)
    d = json.loads(pub.manifest.to_json())
    assert "dedup_index" not in d and "dedup_against" not in d  # a manifest from before keeps its hash
    with pytest.raises(ManifestError, match="published without a dedup index"):
        dx.read_published(pub)


def test_corrupted_or_forged_index_is_refused_like_a_forged_shard(tmp_path):
    pub, texts = _publish(str(tmp_path))
    path = os.path.join(pub.url, pub.manifest.dedup_index[1].path)
    flip_byte(path)
    with pytest.raises(HashMismatchError, match="part-00001.parquet"):
        dx.read_published(pub)
    problems = verify_published(pub)
    assert [p.path for p in problems] == ["dedup_index/part-00001.parquet"]
    assert isinstance(problems[0].error, HashMismatchError)
    # a forged index (another document's keys under d6's id) written in place: its hash differs
    dx.write(path, di.index_rows(PARAMS, [f"d{i}" for i in range(6, 12)], [texts[0]] * 6))
    with pytest.raises(HashMismatchError):
        dx.read_published(pub)
    # a manifest resealed around a forged file with other MinHash parameters: refused by its facts
    forged = os.path.join(str(tmp_path), "forged.parquet")
    bad = {**PARAMS, "seed": 7}
    dx.write(forged, di.index_rows(bad, ["d0"], [texts[0]]))
    with open(forged, "rb") as f:
        data = f.read()
    from gristmill.manifests.hashing import sha256_bytes
    from gristmill.manifests.manifest import FileRef

    ref = FileRef("dedup_index/part-00000.parquet", sha256_bytes(data), len(data), 1)
    assert dx.read_checked(data, ref, "x")[1] == bad  # it reads as what it is
    with pytest.raises(FactMismatchError, match="rows"):
        dx.read_checked(data, FileRef(ref.path, ref.sha256, ref.bytes, 2), "x")
    with pytest.raises(FactMismatchError, match="bytes"):
        dx.read_checked(data, FileRef(ref.path, ref.sha256, ref.bytes + 1, 1), "x")
    not_index = os.path.join(str(tmp_path), "plain.parquet")
    pq.write_table(pa.table({"doc_id": ["d0"]}), not_index)
    with open(not_index, "rb") as f:
        data = f.read()
    with pytest.raises(ManifestError, match="not a dedup index"):
        dx.read_checked(data, FileRef(ref.path, sha256_bytes(data), len(data), 1), "x")


def test_loading_an_earlier_index_checks_it_before_keeping_it(tmp_path):
    from gristmill.errors import ConfigError

    pub, texts = _publish(str(tmp_path))
    ref = pub.manifest.dedup_index[0]
    url = os.path.join(pub.url, ref.path)
    out = str(tmp_path / "work" / "index.parquet")
    assert di.load_index_file(url, ref, PARAMS, "idx v1", out).num_rows == 6
    with open(out, "rb") as f, open(url, "rb") as g:
        assert f.read() == g.read()  # the verified bytes, as published
    with pytest.raises(ConfigError, match=r"fuzzy_dedup.seed: 2 differs from the dedup index of idx v1 \(1\)"):
        di.load_index_file(url, ref, {**PARAMS, "seed": 2}, "idx v1", str(tmp_path / "other.parquet"))
    flip_byte(url)
    assert di.load_index_file(url, ref, PARAMS, "idx v1", out).num_rows == 6  # kept with the pinned hash: not read again
    with pytest.raises(HashMismatchError, match="part-00000.parquet"):
        di.load_index_file(url, ref, PARAMS, "idx v1", str(tmp_path / "fresh.parquet"))
    assert not os.path.exists(tmp_path / "fresh.parquet")


def test_an_exact_key_alone_does_not_make_an_exact_copy():
    from gristmill.pipeline.documents import norm_hash

    texts, _, _ = _texts(3, n=3)
    index = di.index_rows(PARAMS, ["old-0", "old-1"], texts[:2])
    sk, has = di.sketch_texts([texts[2], texts[0]], PARAMS)
    # the first new text claims old-0's key (a collision, or a forged key) but its sketch differs
    m = di.match(PARAMS, 0.8, dx.exact_keys([norm_hash(texts[0])] * 2), sk, has, index)
    assert m["row"].tolist() == [-1, 0] and m["kind"].tolist() == ["", "exact"]
    assert len(dx.exact_keys([norm_hash("x")])[0]) == dx.EXACT_BYTES == 8


def _index_files(tmp, texts, parts, monkeypatch):
    """The dedup_index stage's published files for ``texts`` split into ``parts`` partitions."""
    from gristmill.pipeline.documents import norm_hash
    from gristmill.pipeline.runner import SerialRunner
    from gristmill.pipeline.stages.base import Context
    from gristmill.pipeline.stages.dedup_index.stage import DedupIndex
    from gristmill.pipeline.survivors import Survivors
    from gristmill.pipeline.workdir import WorkDir

    monkeypatch.setattr(di, "ROWS_PER_FILE", 7)  # several published files
    wd = WorkDir(str(tmp))
    size = -(-len(texts) // parts)
    for p in range(parts):
        chunk = list(enumerate(texts))[p * size:(p + 1) * size]
        t = pa.table({"id": [f"d{i:03d}" for i, _ in chunk], "order": pa.array([(p << 32) | k for k in range(len(chunk))], pa.int64()),
                      "text": [t for _, t in chunk], "norm_hash": [norm_hash(t) for _, t in chunk]})
        write_part(wd.docs(p), t.schema, t)

    from gristmill.pipeline.partitions import Partition

    ctx = Context(wd=wd, runner=SerialRunner(wd), partitions=[Partition(p, ()) for p in range(parts)],
                  survivors=Survivors(wd))
    res = ctx.run(DedupIndex(FuzzyDedupConfig()))
    return res.dedup_index, {f.path: pq.read_table(os.path.join(wd.staging, f.path)) for f in res.dedup_index}


def test_the_published_index_is_the_same_whatever_the_partitioning(tmp_path, monkeypatch):
    texts = _texts(5, n=30, words=60)[0]
    one, t1 = _index_files(tmp_path / "one", texts, 1, monkeypatch)
    four, t4 = _index_files(tmp_path / "four", texts, 4, monkeypatch)
    assert len(one) == 5 and [f.rows for f in one] and sum(f.rows for f in one) == 30
    assert one == four  # paths, sha256, bytes, rows
    ids = [i for t in t1.values() for i in t.column("doc_id").to_pylist()]
    assert sorted(ids) == [f"d{i:03d}" for i in range(30)] and len(set(ids)) == 30
    assert all(t.column("doc_id").to_pylist() == sorted(t.column("doc_id").to_pylist()) for t in t1.values())
