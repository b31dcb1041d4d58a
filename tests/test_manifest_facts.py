"""A manifest whose hash is valid but whose facts are wrong: verify and the loader refuse it, naming
the shard, the field, the stated and the actual value; no file or manifest can crash the process."""
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from helpers import build_dataset

from gristmill.loader import Caching, Loader, Sampling, ShardFetchError, Source
from gristmill.manifests import (
    EditedManifestError,
    FactMismatchError,
    LatestPointerError,
    ManifestDecodeError,
    ManifestError,
    ManifestStore,
    TokenOutOfVocabError,
    load_manifest,
    read_doc_index,
    read_rows,
    verify_published,
    write_doc_index,
    write_shard,
)


def rehash(d: dict) -> dict:
    """The manifest hash the documented way (docs/format.md, Identity): sha256 of the canonical JSON
    (sorted keys, no whitespace, UTF-8) without version, created_at and sha256."""
    body = {k: v for k, v in d.items() if k not in ("version", "created_at", "sha256")}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return {**d, "sha256": hashlib.sha256(canonical.encode()).hexdigest()}


def forge(pub, edit) -> None:
    path = os.path.join(pub.url, "manifest.json")
    with open(path) as f:
        d = json.load(f)
    edit(d)
    with open(path, "w") as f:
        json.dump(rehash(d), f)


def serve(url, cache_dir, steps=20):
    with Loader(url, Sampling(global_batch=8, order="sequential"), source=Source(retries=2, backoff_s=0.0),
                caching=Caching(dir=str(cache_dir))) as ld:
        for i, _ in enumerate(ld):
            if i + 1 == steps:
                break


def _rows(d):
    d["shards"][0]["rows"] *= 100
    d["shards"][0]["tokens"] *= 100


def _seq_len(d):
    d["seq_len"] += 4
    for s in d["shards"]:
        s["tokens"] = s["rows"] * (d["seq_len"] + 1)


def _dtype(d):
    d["token_dtype"] = "uint32"


def _bytes(d):
    d["shards"][0]["bytes"] += 1


def _raw_bytes(d):
    d["shards"][0]["raw_bytes"] += 8


FORGERIES = {  # field forged -> (edit, the field the error names, stated, actual)
    "rows": (_rows, "rows", "4000", "40"),
    "seq_len": (_seq_len, "seq_len", "20 (rows of seq_len + 1 = 21 tokens)", "rows of 17 tokens"),
    "token_dtype": (_dtype, "token_dtype", "uint32", "uint16"),
    "bytes": (_bytes, "bytes", None, None),
    "raw_bytes": (_raw_bytes, "raw_bytes", None, None),
}


@pytest.mark.parametrize("fact", sorted(FORGERIES))
def test_a_forged_fact_with_a_recomputed_hash_is_refused_by_verify_and_the_loader(tmp_path, fact, capsys):
    from gristmill.cli import main

    edit, field, stated, actual = FORGERIES[fact]
    pub = build_dataset(str(tmp_path / "ds"))
    serve(pub.url, tmp_path / "warm", steps=15)  # an honest run leaves every train shard cached
    forge(pub, edit)
    forged = load_manifest(pub.url)  # the hash is valid: the manifest itself loads
    assert forged.manifest.sha256 != pub.manifest.sha256

    problems = verify_published(forged)
    assert problems and all(isinstance(p.error, FactMismatchError) for p in problems)
    err = problems[0].error
    assert (err.what, err.field) == ("shards/train-00000.arrow", field)
    if stated is not None:
        assert (str(err.stated), str(err.actual)) == (stated, actual)
    else:
        assert err.stated == getattr(pub.manifest.shards[0], field) + (1 if field == "bytes" else 8)
        assert err.actual == getattr(pub.manifest.shards[0], field)
    assert main(["manifest", "verify", pub.url]) == 1
    assert f"FAILED shards/train-00000.arrow: {field}: manifest states" in capsys.readouterr().out

    # The loader refuses it on a cold cache (checked as downloaded) and on a warm one (checked as mapped;
    # `bytes` describes only the published file, which a warm cache never reads again).
    for cache in ("cold", "warm") if fact != "bytes" else ("cold",):
        with pytest.raises(FactMismatchError, match=f"shards/train-00000.arrow: {field}: manifest states") as info:
            serve(pub.url, tmp_path / cache)
        assert (info.value.field, info.value.stated) == (err.field, err.stated)


def test_a_forged_document_index_fact_is_refused_by_verify(tmp_path):
    pub = build_dataset(str(tmp_path / "ds"))
    forge(pub, lambda d: d["doc_index"].update(rows=d["doc_index"]["rows"] + 1))
    [problem] = verify_published(load_manifest(pub.url))
    assert isinstance(problem.error, FactMismatchError) and problem.path == "doc_index.parquet"
    assert (problem.error.field, problem.error.stated, problem.error.actual) == ("doc_index.rows", 129, 128)


def test_a_doc_index_from_before_the_url_column_is_read_and_verified(tmp_path):
    """Indexes published before ``url`` existed stay valid: verify accepts their schema, readers
    give a null ``url``; an index lacking another column is still refused."""
    import pyarrow.parquet as pq

    from gristmill.manifests.doc_index import LEGACY_SCHEMAS

    pub = build_dataset(str(tmp_path / "ds"))
    path = os.path.join(pub.url, "doc_index.parquet")
    new = pq.read_table(path)
    assert new.column("url").null_count == new.num_rows
    old = new.drop_columns(["url"]).cast(LEGACY_SCHEMAS[0])
    for table, ok in ((old, True), (old.drop_columns(["lang"]), False)):
        pq.write_table(table, path)
        data = open(path, "rb").read()
        forge(pub, lambda d: d["doc_index"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data)))
        problems = verify_published(load_manifest(pub.url))
        if ok:
            assert problems == []
            got = read_doc_index(path, columns=["doc_id", "url"])
            assert got.column("doc_id").to_pylist() == new.column("doc_id").to_pylist()
            assert got.column("url").null_count == got.num_rows
            # as `audit doc` reads it: hash-checked, filtered, the url column asked for
            from gristmill.manifests.doc_index import read_published_doc_index

            one = read_published_doc_index(load_manifest(pub.url), columns=["doc_id", "url"],
                                           filters=[("doc_id", "=", new.column("doc_id")[0].as_py())])
            assert one.num_rows >= 1 and one.column("url").null_count == one.num_rows
        else:
            assert [p.path for p in problems] == ["doc_index.parquet"] and problems[0].error.field == "schema"


@pytest.mark.parametrize("column, value, field, actual", [
    ("row", 40, "row", "span 5 with row 40"),  # shard 0 has rows 0..39
    ("shard", 4, "shard", "span 5 with shard 4"),  # 4 shards
    ("start", 10, "start/length", "span 5 with start/length [10, 17]"),  # 10 + 17 > seq_len + 1
    ("row", 2, "order", "span 5 with order [0, 2, 0]"),  # after row 4 of shard 0
])
def test_a_document_index_with_a_span_outside_the_shards_is_refused_by_verify(tmp_path, column, value, field, actual):
    """A rewritten index whose sha256, bytes and rows are all pinned correctly, with one span that is wrong."""
    pub = build_dataset(str(tmp_path / "ds"))
    path = os.path.join(pub.url, "doc_index.parquet")
    table = read_doc_index(path)
    i = table.schema.get_field_index(column)
    values = table.column(column).to_numpy().copy()
    values[5] = value
    write_doc_index(path, table.set_column(i, column, pa.array(values)))
    data = open(path, "rb").read()
    forge(pub, lambda d: d["doc_index"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data)))
    [problem] = verify_published(load_manifest(pub.url))
    assert isinstance(problem.error, FactMismatchError) and problem.path == "doc_index.parquet"
    assert (problem.error.field, problem.error.actual) == (field, actual)


def test_a_shard_pinned_correctly_but_holding_out_of_vocab_ids_is_refused(tmp_path):
    pub = build_dataset(str(tmp_path / "ds"))  # vocab_size 512
    victim = pub.manifest.shards[1]
    rows = read_rows(os.path.join(pub.url, victim.path)).copy()
    rows[7, 3] = 600
    published = write_shard(os.path.join(pub.url, victim.path), rows)
    raw = write_shard(None, rows, compressed=False)

    def pin(d):
        d["shards"][1].update(sha256=published.sha256, bytes=published.bytes, raw_sha256=raw.sha256, raw_bytes=raw.bytes)
    forge(pub, pin)
    problems = verify_published(load_manifest(pub.url))
    assert [(p.path, type(p.error)) for p in problems] == [(victim.path, TokenOutOfVocabError)]
    assert "token id 600 (first out-of-vocabulary id at row 7, position 3)" in str(problems[0])
    for attempt in ("downloaded", "cached"):  # the second loader finds the forged shard in its cache
        with pytest.raises(TokenOutOfVocabError, match=f"{victim.path}: tokenizer.vocab_size: manifest states 512"):
            serve(pub.url, tmp_path / "cache")


def test_a_garbage_shard_pinned_correctly_is_refused_not_crashed_on(tmp_path):
    pub = build_dataset(str(tmp_path / "ds"))
    victim = pub.manifest.shards[0]
    garbage = np.random.default_rng(0).bytes(3000)
    with open(os.path.join(pub.url, victim.path), "wb") as f:
        f.write(garbage)
    forge(pub, lambda d: d["shards"][0].update(sha256=hashlib.sha256(garbage).hexdigest(), bytes=len(garbage)))
    [problem] = verify_published(load_manifest(pub.url))
    assert problem.path == victim.path and "not a readable gristmill shard" in str(problem)
    with pytest.raises(ShardFetchError, match="not a readable gristmill shard"):
        serve(pub.url, tmp_path / "cache")


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["shards"][0].update(rows="many"), r"shards\[0\].rows: expected an integer in \[0, \d+\), got 'many'"),
    (lambda d: d["shards"][0].update(rows=-1), r"shards\[0\].rows: expected an integer"),
    (lambda d: d["shards"][0].update(rows=2 ** 70), r"shards\[0\].rows: expected an integer"),
    (lambda d: d["shards"][0].update(tokens=3), r"shards\[0\].tokens: 3 is not rows \* \(seq_len \+ 1\)"),
    (lambda d: d.update(seq_len=0), r"manifest.seq_len: expected an integer in \[1, "),
    (lambda d: d.update(shards=5), "manifest.shards: expected a list, got int"),
    (lambda d: d["tokenizer"].update(eos_id=512), r"tokenizer.eos_id: expected an integer in \[0, 512\)"),
])
def test_impossible_stated_counts_are_refused_on_load(tmp_path, edit, message):
    pub = build_dataset(str(tmp_path / "ds"))
    forge(pub, edit)
    with pytest.raises(ManifestError, match=message):
        load_manifest(pub.url)


def test_a_garbage_latest_pointer_names_what_it_holds_and_the_fix(tmp_path, capsys):
    from gristmill.cli import main

    pub = build_dataset(str(tmp_path / "ds"))
    root = tmp_path / "ds" / "store"
    (root / "toy" / "latest").write_bytes(b"\xffgarbage\n")
    for call in (lambda: load_manifest(str(root / "toy")), lambda: ManifestStore(str(root)).latest("toy")):
        with pytest.raises(LatestPointerError, match=r"latest pointer holds b'\\xffgarbage\\n', not a version number; "
                                                     r"write the newest published version"):
            call()
    assert main(["manifest", "show", str(root / "toy")]) == 2
    assert "latest pointer holds" in capsys.readouterr().err
    assert load_manifest(pub.url).manifest.sha256 == pub.manifest.sha256  # the versions themselves are untouched


@pytest.fixture
def damaged_reads(monkeypatch):
    """The first ``n`` reads of any manifest.json return ``bad`` instead (a damaged read from a remote)."""
    from fsspec.implementations.local import LocalFileSystem

    state = {"n": 0, "bad": b""}
    real = LocalFileSystem.cat_file

    def cat_file(self, path, *args, **kw):
        if str(path).endswith("manifest.json") and state["n"] > 0:
            state["n"] -= 1
            return state["bad"]
        return real(self, path, *args, **kw)

    monkeypatch.setattr(LocalFileSystem, "cat_file", cat_file)
    return state


@pytest.mark.parametrize("damage", ["not utf-8", "truncated", "flipped"])
def test_damaged_manifest_reads_are_retried_and_a_persistent_one_is_named(tmp_path, damaged_reads, damage):
    pub = build_dataset(str(tmp_path / "ds"))
    good = open(os.path.join(pub.url, "manifest.json"), "rb").read()
    damaged_reads["bad"] = {"not utf-8": b"\xff" + good[1:], "truncated": good[: len(good) // 2],
                            "flipped": good.replace(b'"rows": 40', b'"rows": 41')}[damage]
    damaged_reads["n"] = 2  # transient: the third read is good
    with Loader(pub.url, Sampling(global_batch=8), source=Source(retries=3, backoff_s=0.0),
                caching=Caching(dir=str(tmp_path / "c"))) as ld:
        assert ld.manifest.sha256 == pub.manifest.sha256
    assert damaged_reads["n"] == 0
    damaged_reads["n"] = 3  # persistent
    want = EditedManifestError if damage == "flipped" else ManifestDecodeError
    with pytest.raises(want, match="edited after publishing" if damage == "flipped" else "the same in all 3 reads"):
        Loader(pub.url, Sampling(global_batch=8), source=Source(retries=3, backoff_s=0.0),
               caching=Caching(dir=str(tmp_path / "c")))


def test_gather_refuses_any_row_outside_its_shard_before_reading_it():
    from gristmill.loader.gather import RowOutOfBoundsError, gather_rows

    shard = np.arange(4 * 5, dtype=np.uint16).reshape(4, 5)
    lo, row = shard.ctypes.data, shard.strides[0]
    hi = lo + shard.nbytes
    like = shard[:0]

    def gather(sources, starts=lo, ends=hi):
        n = len(sources)
        out = np.zeros((n, 5), np.int64)
        gather_rows(out, np.array(sources, np.int64), np.full(n, starts, np.int64), np.full(n, ends, np.int64), like)
        return out

    assert np.array_equal(gather([lo + 3 * row, lo]), shard[[3, 0]])
    for sources, kw in (([lo + 4 * row], {}), ([lo - row], {}), ([lo + 1], {}), ([lo], {"starts": 0}),
                        ([lo, lo + 2 * row], {"ends": lo + 2 * row})):
        with pytest.raises(RowOutOfBoundsError, match="nothing was read"):
            gather(sources, **kw)


def test_the_loader_runs_where_numba_cannot_write_its_cache(tmp_path):
    """numba's own failure: no cache locator with a writable directory (NUMBA_CACHE_DIR and the
    user-wide cache dir under a regular file, the in-tree __pycache__ not tried, as for a read-only install)."""
    pub = build_dataset(str(tmp_path / "ds"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(blocker / "numba"), "XDG_CACHE_HOME": str(blocker / "xdg"),
           "NUMBA_CACHE_LOCATOR_CLASSES": "UserProvidedCacheLocator,UserWideCacheLocator"}
    child = ("import sys\nfrom gristmill.loader import Caching, Loader, Sampling\n"
             "with Loader(sys.argv[1], Sampling(global_batch=8, order='sequential'), caching=Caching(dir=sys.argv[2])) as ld:\n"
             "    print(next(iter(ld))['tokens'][:, :2].tolist())\n")
    done = subprocess.run([sys.executable, "-c", child, pub.url, str(tmp_path / "cache")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cannot cache function '_gather'" in done.stderr  # numba's refusal happened, and was survived
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[1, r] for r in range(8)]


def test_a_manifest_string_that_is_not_unicode_is_refused_on_load(tmp_path):
    pub = build_dataset(str(tmp_path / "ds"))
    path = os.path.join(pub.url, "manifest.json")
    text = re.sub(r'"code_version": "[^"]*"', lambda _: '"code_version": "\\udcff"', open(path).read())
    assert text != open(path).read()
    open(path, "w").write(text)
    with pytest.raises(ManifestDecodeError, match="not valid Unicode"):
        load_manifest(pub.url)
