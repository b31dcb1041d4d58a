"""Manifest facts that a recomputed hash cannot vouch for, checked against the files (issue 26):
the shards' order (against the document index and the shards' EOS tokens) and each shard's split
(against the document index and the split rule of the config)."""
import json
import os

import pyarrow as pa
import pytest
from helpers import build_dataset
from test_manifest_facts import forge

from gristmill.manifests import FactMismatchError, load_manifest, read_doc_index, verify_published, write_doc_index
from gristmill.manifests.hashing import sha256_file, stable_fraction


def problems(pub):
    return {p.path: p.error for p in verify_published(load_manifest(pub.url))}


@pytest.fixture
def packed(tmp_path):
    return build_dataset(str(tmp_path / "d"), doc_tokens=(3, 12), shard_rows=(20, 15, 25), val_rows=(6,))


def test_a_packed_synthetic_dataset_verifies(packed):
    assert problems(packed) == {}


def test_two_train_shards_of_equal_rows_swapped_fail_verify_against_their_document_ends(tmp_path):
    pub = build_dataset(str(tmp_path / "d"), doc_tokens=(3, 12), shard_rows=(20, 20, 20), val_rows=(6,))

    def swap(d):
        d["shards"][0], d["shards"][1] = d["shards"][1], d["shards"][0]

    forge(pub, swap)
    found = problems(pub)
    assert set(found) == {pub.manifest.shards[0].path, pub.manifest.shards[1].path}
    err = found[pub.manifest.shards[1].path]  # now at position 0
    assert isinstance(err, FactMismatchError) and "shards[0] documents" in str(err) and "shards reordered?" in str(err)


def test_two_train_shards_of_different_rows_swapped_fail_verify_by_the_index_bounds(packed):
    def swap(d):
        d["shards"][0], d["shards"][2] = d["shards"][2], d["shards"][0]

    forge(packed, swap)
    assert "a row inside its shard" in str(problems(packed)[packed.manifest.doc_index.path])


def test_a_validation_shard_before_a_train_shard_fails_verify(packed):
    def move(d):
        d["shards"].insert(0, d["shards"].pop())

    forge(packed, move)
    assert "every train shard before every validation shard" in str(problems(packed)["manifest.json"])


RULE = {"validation_fraction": 0.3, "seed": 7}


def _with_the_split_rule(pub):
    """The dataset's documents renamed so that `prepare`'s split rule (config.split) puts each in its
    shard's split, as in a manifest prepare wrote."""
    m = pub.manifest
    index_path = os.path.join(pub.url, m.doc_index.path)
    index = read_doc_index(index_path)
    names, n = {}, 0
    for old, shard in zip(index.column("doc_id").to_pylist(), index.column("shard").to_pylist()):
        if old not in names:
            want = m.shards[shard].split == "validation"
            while (stable_fraction(f"d{n}", RULE["seed"]) < RULE["validation_fraction"]) != want:
                n += 1
            names[old], n = f"d{n}", n + 1
    index = index.set_column(index.schema.get_field_index("doc_id"), "doc_id",
                             pa.array([names[d] for d in index.column("doc_id").to_pylist()]))
    write_doc_index(index_path, index)
    sha, size = sha256_file(index_path)

    def edit(d):
        d["doc_index"].update(sha256=sha, bytes=size)
        d["config"]["split"] = dict(RULE)
        d["config_sha256"] = sha256_json(d["config"])

    forge(pub, edit)


def sha256_json(obj):
    from gristmill.manifests.hashing import sha256_json as h

    return h(obj)


def test_a_validation_shard_relabelled_train_fails_verify_by_the_split_rule(packed):
    _with_the_split_rule(packed)
    assert problems(packed) == {}  # the rule holds for every document as published

    def relabel(d):
        d["shards"][-1]["split"] = "train"

    forge(packed, relabel)
    err = problems(packed)[packed.manifest.doc_index.path]
    assert isinstance(err, FactMismatchError) and "is validation by the rule but in shards[3], a train shard" in str(err)


# -- the hash covers the file exactly; a manifest error is one line (issue 26) ---------------------------
from gristmill.cli import main  # noqa: E402
from gristmill.manifests import EditedManifestError, ManifestDecodeError, ManifestError, SchemaVersionError  # noqa: E402
from gristmill.manifests.errors import UnsafePathError  # noqa: E402


def _manifest_text(pub) -> str:
    with open(os.path.join(pub.url, "manifest.json")) as f:
        return f.read()


def _write_text(pub, text: str) -> None:
    with open(os.path.join(pub.url, "manifest.json"), "w") as f:
        f.write(text)


def _one_line(capsys, args, needle):
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(extra={"note": "outside the hash?"}), "extra"),
    (lambda d: d["shards"][0].update(weight_hint=2), "shards"),
    (lambda d: d["tokenizer"].update(eos_token="<x>"), "tokenizer"),
    (lambda d: d["doc_index"].update(rows=None), "doc_index"),
    (lambda d: d.update(dataset=7), "dataset"),
    (lambda d: d.pop("eval_sets"), "eval_sets"),
])
def test_every_field_but_the_unhashed_three_is_hashed_exactly_as_written(toy_dataset, capsys, edit, field):
    forge(toy_dataset, edit)  # the hash recomputed the documented way, over the file's own JSON
    with pytest.raises(ManifestError, match=rf"manifest: field\(s\) {field} hold\(s\) what this gristmill does not read"):
        load_manifest(toy_dataset.url)
    _one_line(capsys, ["manifest", "verify", toy_dataset.url], "is hashed exactly as written")


@pytest.mark.parametrize("value", [1.0, True, "1"])
def test_a_schema_version_that_is_not_the_integer_1_is_refused(toy_dataset, value):
    forge(toy_dataset, lambda d: d.update(schema_version=value))
    with pytest.raises(SchemaVersionError, match="unknown schema_version"):
        load_manifest(toy_dataset.url)


def test_duplicate_json_keys_are_refused(toy_dataset, capsys):
    text = _manifest_text(toy_dataset)
    _write_text(toy_dataset, text.replace('"seq_len": 16', '"seq_len": 16, "seq_len": 8', 1))
    with pytest.raises(ManifestDecodeError, match="key 'seq_len' appears twice"):
        load_manifest(toy_dataset.url)
    _one_line(capsys, ["manifest", "show", toy_dataset.url], "appears twice")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000])
def test_nan_infinity_and_huge_numbers_are_one_line_errors(toy_dataset, capsys, literal):
    text = _manifest_text(toy_dataset)
    _write_text(toy_dataset, text.replace('"stats": {', f'"stats": {{"bad": {literal}, ', 1))
    with pytest.raises(ManifestDecodeError):
        load_manifest(toy_dataset.url)
    for cmd in ("show", "verify"):
        _one_line(capsys, ["manifest", cmd, toy_dataset.url], "manifest.json")


def test_nan_in_a_manifest_dict_is_a_decode_error_not_a_traceback(toy_dataset):
    from gristmill.manifests import Manifest

    d = json.loads(_manifest_text(toy_dataset))
    d["stats"]["bad"] = float("nan")
    with pytest.raises(ManifestDecodeError, match="not JSON"):
        Manifest.from_dict(d)


@pytest.mark.parametrize("path", ["shards/a\x00.arrow", "shards/a\n.arrow", "shards\\a.arrow", "shards/../x.arrow",
                                  "/etc/passwd", "shards//a.arrow", "./shards/a.arrow", "C:/a.arrow", "file:///x",
                                  "shards/a\x7f.arrow", "shards/"])
def test_odd_characters_in_a_shard_path_are_one_line_errors(toy_dataset, capsys, path):
    forge(toy_dataset, lambda d: d["shards"][0].update(path=path))
    with pytest.raises(UnsafePathError, match=r"shards\[0\]: path"):
        load_manifest(toy_dataset.url)
    for cmd in ("show", "verify"):
        _one_line(capsys, ["manifest", cmd, toy_dataset.url], "shards[0]: path")


def test_an_edited_config_with_a_stale_config_sha256_is_refused(toy_dataset, capsys):
    forge(toy_dataset, lambda d: d["config"].update(edited=True))
    with pytest.raises(ManifestError, match="config_sha256: .* is not the sha256 of config"):
        load_manifest(toy_dataset.url)
    _one_line(capsys, ["manifest", "verify", toy_dataset.url], "config was edited")


def test_a_changed_eos_id_fails_verify_against_the_documents_ends(packed):
    forge(packed, lambda d: d["tokenizer"].update(eos_id=1))
    found = problems(packed)
    assert all(s.path in found for s in packed.manifest.shards)
    assert "document index spans ending with eos_id 1" in str(found[packed.manifest.shards[0].path])


def test_the_recorded_hash_still_refuses_a_plain_edit(toy_dataset):
    text = _manifest_text(toy_dataset)
    _write_text(toy_dataset, text.replace('"seq_len": 16', '"seq_len": 15', 1))
    with pytest.raises(EditedManifestError):
        load_manifest(toy_dataset.url)


def test_a_changed_eos_id_fails_verify_against_the_tokenizer_named_in_the_config(toy_dataset):
    from gristmill.manifests.hashing import sha256_json as h

    def name_the_eos(d):
        d["config"]["tokenizer"] = {"eos_token": "<eos>"}  # as prepare's config does; <eos> is id 0
        d["config_sha256"] = h(d["config"])

    forge(toy_dataset, name_the_eos)
    assert problems(toy_dataset) == {}
    forge(toy_dataset, lambda d: d["tokenizer"].update(eos_id=3))
    err = problems(toy_dataset)[toy_dataset.manifest.tokenizer.path]
    assert "tokenizer.eos_id: manifest states 3, file holds 0 for config.tokenizer.eos_token '<eos>'" in str(err)
