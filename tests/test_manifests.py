import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from helpers import build_dataset, flip_byte

from gristmill.manifests import (
    DOC_INDEX_SCHEMA,
    HashMismatchError,
    Manifest,
    ManifestError,
    ManifestStore,
    MappedShard,
    MissingFieldError,
    SchemaVersionError,
    UnsafePathError,
    VersionExistsError,
    load_manifest,
    read_doc_index,
    read_rows,
    verify_published,
    write_cache_form,
    write_shard,
)
from gristmill.manifests.shards import shard_schema


def test_shard_round_trip_and_random_access(tmp_path):
    rows = np.arange(5 * 9, dtype=np.uint16).reshape(5, 9)
    stats = write_shard(str(tmp_path / "a.arrow"), rows)
    assert (stats.rows, stats.tokens) == (5, 45)
    np.testing.assert_array_equal(read_rows(str(tmp_path / "a.arrow"), expected_sha256=stats.sha256), rows)
    write_cache_form(str(tmp_path / "a.arrow"), str(tmp_path / "a.raw"))
    mapped = MappedShard(str(tmp_path / "a.raw"))
    np.testing.assert_array_equal(mapped[3], rows[3])
    np.testing.assert_array_equal(mapped.take(np.array([4, 0])), rows[[4, 0]])
    assert not mapped.rows.flags.owndata  # zero-copy view on the memory map
    mapped.close()


def test_shard_bytes_are_deterministic_and_uint32_when_vocab_is_large(tmp_path):
    rows = np.random.default_rng(1).integers(0, 100_000, size=(7, 5)).astype(np.uint32)
    a = write_shard(str(tmp_path / "a.arrow"), rows)
    b = write_shard(str(tmp_path / "b.arrow"), rows.copy())
    assert a.sha256 == b.sha256
    assert (tmp_path / "a.arrow").read_bytes() == (tmp_path / "b.arrow").read_bytes()
    # Open with plain pyarrow, no gristmill: the format is self-describing.
    table = ipc.open_file(str(tmp_path / "a.arrow")).read_all()
    assert table.schema.equals(shard_schema(5, "uint32"))
    assert table.column("tokens").type.value_type == pa.uint32()


def test_flipped_byte_in_shard_is_named(tmp_path):
    rows = np.ones((4, 9), dtype=np.uint16)
    stats = write_shard(str(tmp_path / "s.arrow"), rows)
    flip_byte(str(tmp_path / "s.arrow"))
    with pytest.raises(HashMismatchError, match="s.arrow"):
        read_rows(str(tmp_path / "s.arrow"), expected_sha256=stats.sha256)


def test_publish_round_trip_and_verify(tmp_path):
    pub = build_dataset(str(tmp_path))
    m = pub.manifest
    assert pub.url.endswith("store/toy/v1") and m.version == 1
    again = load_manifest(str(tmp_path / "store" / "toy"))  # via the latest pointer
    assert again.manifest == m and again.manifest.sha256 == m.sha256
    assert verify_published(again) == []
    assert [s.split for s in m.shards] == ["train"] * 3 + ["validation"]
    assert m.token_dtype == "uint16" and m.row_tokens == 17


@pytest.mark.parametrize("target", ["shards/train-00001.arrow", "doc_index.parquet"])
def test_verify_names_each_corrupt_file(tmp_path, target):
    pub = build_dataset(str(tmp_path))
    flip_byte(os.path.join(pub.url, target))
    problems = verify_published(load_manifest(pub.url))
    assert [p.path for p in problems] == [target]
    assert "sha256" in problems[0].reason


def test_same_content_same_hash_and_republish_is_idempotent(tmp_path):
    a = build_dataset(str(tmp_path / "a"))
    b = build_dataset(str(tmp_path / "b"))
    assert a.manifest.sha256 == b.manifest.sha256  # different roots, different times, same content
    again = build_dataset(str(tmp_path / "a"))
    assert again.manifest.version == 1 and again.manifest.sha256 == a.manifest.sha256
    other = build_dataset(str(tmp_path / "a"), seed=1)
    assert other.manifest.version == 2 and other.manifest.sha256 != a.manifest.sha256
    assert ManifestStore(str(tmp_path / "a" / "store")).versions("toy") == [1, 2]


def test_second_publish_of_an_existing_version_is_refused(tmp_path):
    pub = build_dataset(str(tmp_path))
    staged = build_dataset(str(tmp_path), seed=3, publish=False)
    store = ManifestStore(str(tmp_path / "store"))
    with pytest.raises(VersionExistsError, match="v1 is already published"):
        store.publish(staged.manifest, staged.url, version=1)
    assert load_manifest(pub.url).manifest.sha256 == pub.manifest.sha256


def _manifest_dict(tmp_path):
    return json.loads(build_dataset(str(tmp_path)).manifest.to_json())


@pytest.mark.parametrize("bad_path", ["../../etc/passwd", "/etc/passwd", "shards/../../x.arrow", "s3://bucket/x"])
def test_path_traversal_is_refused(tmp_path, bad_path):
    d = _manifest_dict(tmp_path)
    d["shards"][0]["path"] = bad_path
    d.pop("sha256")
    with pytest.raises(UnsafePathError, match="shards\\[0\\]"):
        Manifest.from_dict(d)


def test_validation_errors_are_specific(tmp_path):
    d = _manifest_dict(tmp_path)
    with pytest.raises(SchemaVersionError, match="schema_version 99"):
        Manifest.from_dict({**d, "schema_version": 99})
    with pytest.raises(MissingFieldError, match="tokenizer"):
        Manifest.from_dict({k: v for k, v in d.items() if k != "tokenizer"})
    edited = {**d, "seq_len": 32}
    with pytest.raises(HashMismatchError, match="edited after publishing"):
        Manifest.from_dict(edited)
    with pytest.raises(HashMismatchError, match="pinned by the caller"):
        Manifest.from_dict(d, expected_sha256="0" * 64)


def test_aborted_publish_is_invisible(tmp_path):
    pub = build_dataset(str(tmp_path))
    os.makedirs(tmp_path / "store" / "toy" / "v2" / "shards")  # files copied, manifest never written
    store = ManifestStore(str(tmp_path / "store"))
    assert store.versions("toy") == [1]
    staged = build_dataset(str(tmp_path), seed=5, publish=False)
    assert store.publish(staged.manifest, staged.url).manifest.version == 3
    assert pub.manifest.version == 1


def test_cli_show_verify_list(tmp_path, capsys):
    from gristmill.cli import main

    pub = build_dataset(str(tmp_path))
    assert main(["manifest", "verify", pub.url]) == 0
    assert "OK: all 6 pinned files" in capsys.readouterr().out
    assert main(["manifest", "list", str(tmp_path / "store")]) == 0
    assert pub.manifest.sha256 in capsys.readouterr().out
    assert main(["manifest", "show", pub.url]) == 0
    assert "train        3 shards, 120 rows" in capsys.readouterr().out
    flip_byte(os.path.join(pub.url, "shards/train-00002.arrow"))
    assert main(["manifest", "verify", pub.url]) == 1
    assert "FAILED shards/train-00002.arrow" in capsys.readouterr().out
    assert main(["manifest", "show", str(tmp_path / "nowhere")]) == 2
    assert "no manifest at" in capsys.readouterr().err


def _spans(n, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({"shard": rng.integers(0, 4, n).astype(np.int32), "row": np.arange(n), "start": np.zeros(n, np.int32),
                     "length": np.full(n, 9, np.int32), "doc_id": [f"d{i}" for i in range(n)],
                     "source": ["s3://b/x.jsonl"] * n, "position": np.arange(n), "lang": ["en"] * n})


def test_doc_index_streamed_in_any_chunks_is_byte_identical(tmp_path, monkeypatch):
    import gristmill.manifests.doc_index as di

    monkeypatch.setattr(di, "ROW_GROUP_ROWS", 100)  # several row groups from a small table
    table = _spans(1_037)
    di.write_doc_index(str(tmp_path / "whole.parquet"), table)
    with di.DocIndexWriter(str(tmp_path / "streamed.parquet")) as w:
        for lo, hi in ((0, 1), (1, 250), (250, 251), (251, 900), (900, 1_037)):
            w.write(table.slice(lo, hi - lo))
    whole, streamed = (tmp_path / "whole.parquet").read_bytes(), (tmp_path / "streamed.parquet").read_bytes()
    assert whole == streamed
    meta = pq.ParquetFile(tmp_path / "whole.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [100] * 10 + [37]
    with_url = table.append_column("url", pa.nulls(table.num_rows, pa.string()))  # no URLs given: null
    assert read_doc_index(str(tmp_path / "streamed.parquet")).equals(with_url.cast(DOC_INDEX_SCHEMA))


def test_doc_index_writer_that_fails_leaves_no_index(tmp_path):
    from gristmill.manifests.doc_index import DocIndexWriter

    path = tmp_path / "doc_index.parquet"
    with pytest.raises(ManifestError, match="does not match the schema"):
        with DocIndexWriter(str(path)) as w:
            w.write(_spans(10))
            w.write(pa.table({"shard": [1]}))  # a bad batch mid-stream
    assert not path.exists() and not list(tmp_path.iterdir())
