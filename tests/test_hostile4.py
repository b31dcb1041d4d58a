"""Hostile inputs, fourth round (issue 39): symlinks out of an input folder, eval file or earlier
version (refused unread unless opted in), ... Each finding is a test that failed before its fix."""
import bz2
import glob
import gzip
import io
import json
import os
import random
import shutil
import uuid

import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard

from gristmill import cli

WORDS = ("river stone bread lamp window garden letter market winter candle harbor meadow silver thunder "
         "orchard ladder pepper violin saddle marble lantern basket feather copper").split()


def _one_line(err: str, *parts: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err[-3000:]
    for p in parts:
        assert p in err, err
    return err


def _texts(seed: int, n: int, words: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]


def _write_jsonl(path, rows) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _job(inputs, out, **over) -> str:
    job = {"inputs": inputs, "output": {"store": str(out / "store"), "dataset": "t", "report_html": False},
           "work_dir": str(out / "work"), "language": {"enabled": False}, "split": {"validation_fraction": 0.0},
           "tokenizer": {"vocab_size": 300, "sample_bytes": 200_000}, "pack": {"seq_len": 32},
           "runner": {"kind": "local", "num_cpus": 1}}
    job.update(over)
    path = out / f"job-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


# -- every byte a run left: the marker must be in none of them -----------------------------------
def _decoded(path: str, data: bytes) -> list[bytes]:
    """The file's bytes and every decoding of them that could hide a text: gzip/zstd/bz2 streams,
    Parquet (every column of every row group, as text), Arrow IPC files."""
    out = [data]
    for suffix, decode in ((".gz", gzip.decompress), (".zst", lambda b: zstandard.ZstdDecompressor().stream_reader(
            io.BytesIO(b)).read()), (".bz2", bz2.decompress)):
        if path.endswith(suffix):
            out.append(decode(data))
    if data[:4] == b"PAR1":
        out.append(str(pq.read_table(io.BytesIO(data)).to_pylist()).encode("utf-8", "backslashreplace"))
    if data[:6] == b"ARROW1":
        out.append(str(ipc.open_file(io.BytesIO(data)).read_all().to_pylist()).encode("utf-8", "backslashreplace"))
    return out


def _files_holding(marker: str, *roots) -> list[str]:
    found = []
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as f:
                    data = f.read()
                if any(marker.encode() in d for d in _decoded(path, data)):
                    found.append(path)
    return found


def _quarantine(out) -> list[dict]:
    (path,) = glob.glob(str(out / "work" / "*" / "quarantine.jsonl"))
    with open(path) as f:
        return [json.loads(line) for line in f]


# -- 1. the escape: symlinks out of an input folder ----------------------------------------------
@pytest.fixture
def linked_corpus(tmp_path):
    """in/ holds two ordinary files, a link to a file inside it (followed) and two links to files
    outside it holding a unique marker: shadow.txt (a text document) and passwd.jsonl (lines no
    JSON parser accepts: before the fix they were copied verbatim into quarantine.jsonl)."""
    marker = f"SECRET{uuid.uuid4().hex}"
    outside, corpus = tmp_path / "outside", tmp_path / "in"
    os.makedirs(outside), os.makedirs(corpus / "sub")
    (outside / "shadow").write_text(" ".join([marker] + _texts(1, 1)[0].split()) + "\n")
    (outside / "passwd").write_text("".join(f"user{i}:x:{i}:{i}:{marker}:/home/u{i}:/bin/sh\n" for i in range(23)))
    _write_jsonl(corpus / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(_texts(2, 30))])
    _write_jsonl(corpus / "sub" / "b.jsonl", [{"id": f"b{i}", "text": t} for i, t in enumerate(_texts(3, 10))])
    (corpus / "inside.jsonl").symlink_to(corpus / "sub" / "b.jsonl")  # inside the folder: an ordinary input
    (corpus / "shadow.txt").symlink_to(outside / "shadow")
    (corpus / "passwd.jsonl").symlink_to(outside / "passwd")
    return corpus, marker


def _linked_inputs(corpus, **entry) -> list[dict]:
    return [{"path": str(corpus / "*.jsonl"), "id_field": "id", **entry}, {"path": str(corpus / "*.txt"), **entry}]


def test_an_input_linked_outside_its_folder_is_quarantined_unread(linked_corpus, tmp_path, capsys):
    corpus, marker = linked_corpus
    out = tmp_path / "run"
    os.makedirs(out)
    assert cli.main(["prepare", "--quiet", _job(_linked_inputs(corpus), out)]) == 0, capsys.readouterr().err
    assert _files_holding(marker, out / "store", out / "work") == []
    refused = {os.path.basename(q["source"]): q for q in _quarantine(out) if q["reason"] == "symlink_outside_root"}
    assert set(refused) == {"shadow.txt", "passwd.jsonl"}
    for q in refused.values():
        assert q["raw"] == "" and "follow_symlinks" in q["detail"] and str(tmp_path / "outside") in q["detail"]
    from gristmill.manifests import load_manifest
    from gristmill.manifests.doc_index import read_published_doc_index

    pub = load_manifest(str(out / "store" / "t"))
    ids = set(read_published_doc_index(pub, columns=["doc_id"]).column("doc_id").to_pylist())
    assert len(ids) == 30 + 10  # a.jsonl, and inside.jsonl (a link that stays in the folder)
    assert {os.path.basename(i.uri) for i in pub.manifest.inputs} == {"a.jsonl", "inside.jsonl"}  # never hashed either


def test_follow_symlinks_lets_a_linked_input_in(linked_corpus, tmp_path, capsys):
    corpus, marker = linked_corpus
    out = tmp_path / "run"
    os.makedirs(out)
    assert cli.main(["prepare", "--quiet", _job(_linked_inputs(corpus, follow_symlinks=True), out)]) == 0, \
        capsys.readouterr().err
    assert not [q for q in _quarantine(out) if q["reason"] == "symlink_outside_root"]
    assert _files_holding(marker, out / "work")  # the opted-in document is read (and passwd's lines quarantined)


def test_a_glob_root_is_resolved_and_a_plain_path_root_is_its_folder(tmp_path):
    from gristmill.manifests.storage import LocalStore
    from gristmill.pipeline.executor import pattern_root

    assert pattern_root("/data/web/*.jsonl") == "/data/web"
    assert pattern_root("/data/*/x/*.jsonl") == "/data"
    assert pattern_root("/data/web/a.jsonl") == "/data/web"
    assert pattern_root("s3://bucket/web/**") == "s3://bucket/web"
    real = tmp_path / "real"
    os.makedirs(real / "in")
    (real / "in" / "a.jsonl").write_text("{}\n")
    (tmp_path / "linked").symlink_to(real / "in")  # a linked root is the user's own choice
    store = LocalStore()
    assert store.escapes(str(tmp_path / "linked" / "a.jsonl"), str(tmp_path / "linked")) is None
    (real / "in" / "up.jsonl").symlink_to(real / "x.jsonl")
    assert store.escapes(str(tmp_path / "linked" / "up.jsonl"), str(tmp_path / "linked")) == str(real / "x.jsonl")


# -- 1b. the same rule for eval files and dedup_against -----------------------------------------
def test_an_eval_file_linked_outside_its_folder_is_refused_unread(tmp_path, capsys):
    marker = f"EVALSECRET{uuid.uuid4().hex}"
    texts = _texts(4, 20)
    corpus, outside, evals = tmp_path / "in", tmp_path / "outside", tmp_path / "evals"
    for d in (corpus, outside, evals):
        os.makedirs(d)
    _write_jsonl(corpus / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(texts)])
    _write_jsonl(outside / "test.jsonl", [{"text": texts[3]}, {"text": f"{marker} " + _texts(5, 1)[0]}])
    (evals / "test.jsonl").symlink_to(outside / "test.jsonl")
    inputs = [{"path": str(corpus / "a.jsonl"), "id_field": "id"}]
    out = tmp_path / "run"
    os.makedirs(out)
    eval_set = {"name": "t", "path": str(evals / "test.jsonl")}
    assert cli.main(["prepare", "--quiet", _job(inputs, out, decontaminate={"eval_sets": [eval_set]})]) == 2
    _one_line(capsys.readouterr().err, "eval file", "symlink_outside_root", str(outside / "test.jsonl"), "follow_symlinks")
    assert _files_holding(marker, out) == []
    assert cli.main(["prepare", "--quiet", _job(inputs, out, decontaminate={
        "eval_sets": [{**eval_set, "follow_symlinks": True}]})]) == 0, capsys.readouterr().err
    from gristmill.manifests import load_manifest

    m = load_manifest(str(out / "store" / "t")).manifest
    assert m.stats["accounting"]["removed"] == {"contaminated": 1}  # a3 matched the linked eval item: opted in, the file was read


@pytest.fixture(scope="module")
def earlier_version(tmp_path_factory):
    """A published version with a dedup index (v1 of dataset ``old``)."""
    root = tmp_path_factory.mktemp("earlier")
    os.makedirs(root / "in")
    _write_jsonl(root / "in" / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(_texts(6, 30))])
    job = _job([{"path": str(root / "in" / "a.jsonl"), "id_field": "id"}], root, fuzzy_dedup={})
    assert cli.main(["prepare", "--quiet", job]) == 0
    return root / "store" / "t" / "v1"


@pytest.mark.slow
@pytest.mark.parametrize("linked", ["manifest", "index"])
def test_dedup_against_a_version_linked_outside_its_folder_is_refused_unread(earlier_version, tmp_path, capsys, linked):
    from gristmill.manifests import load_manifest

    # a copy of v1 in which one file is a link to an identical file elsewhere: the hashes match,
    # so before the fix it was followed and read
    copy, outside = tmp_path / "copy" / "old" / "v1", tmp_path / "outside"
    shutil.copytree(earlier_version, copy)
    os.makedirs(outside)
    name = "manifest.json" if linked == "manifest" else load_manifest(str(copy)).manifest.dedup_index[0].path
    shutil.copyfile(copy / name, outside / "file")
    os.unlink(copy / name)
    (copy / name).symlink_to(outside / "file")
    os.makedirs(tmp_path / "in")
    _write_jsonl(tmp_path / "in" / "b.jsonl", [{"id": f"b{i}", "text": t} for i, t in enumerate(_texts(7, 10))])
    inputs = [{"path": str(tmp_path / "in" / "b.jsonl"), "id_field": "id"}]
    tokenizer = {"path": str(earlier_version / "tokenizer.json")}
    out = tmp_path / "run"
    os.makedirs(out)
    assert cli.main(["prepare", "--quiet", _job(inputs, out, fuzzy_dedup={}, tokenizer=tokenizer,
                                                dedup_against=[str(copy)])]) == 2
    _one_line(capsys.readouterr().err, "symlink_outside_root", str(outside / "file"), "follow_symlinks")
    assert cli.main(["prepare", "--quiet", _job(inputs, out, fuzzy_dedup={}, tokenizer=tokenizer, dedup_against=[
        {"url": str(copy), "follow_symlinks": True}])]) == 0, capsys.readouterr().err


# -- 3. `::` in a local path: a local path is a local path (never an fsspec chain) -------------------
@pytest.fixture
def plain_corpus(tmp_path):
    os.makedirs(tmp_path / "in")
    _write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(_texts(8, 30))])
    return [{"path": str(tmp_path / "in" / "a.jsonl"), "id_field": "id"}]


def test_a_store_path_with_double_colons_publishes_what_every_reader_opens(plain_corpus, tmp_path, capsys):
    from gristmill.loader import Loader, Sampling
    from gristmill.manifests import load_manifest, verify_published

    out = tmp_path / "run::1"
    os.makedirs(out)
    job = _job(plain_corpus, out)
    assert cli.main(["prepare", "--quiet", job]) == 0, capsys.readouterr().err
    store = str(out / "store")
    for args in (["manifest", "show", f"{store}/t"], ["manifest", "verify", f"{store}/t"], ["manifest", "list", store]):
        assert cli.main(args) == 0, (args, capsys.readouterr())
    pub = load_manifest(f"{store}/t")
    assert pub.url == f"{store}/t/v1" and verify_published(pub) == []
    with Loader(pub.url, Sampling(global_batch=2, seed=0)) as ld:
        assert next(iter(ld))["tokens"].shape[0] == 2
    assert cli.main(["prepare", "--quiet", job]) == 0  # the rerun finds its version (no v2)
    assert sorted(os.listdir(f"{store}/t")) == ["latest", "v1"]
    mix = tmp_path / "mix.yaml"
    mix.write_text(yaml.safe_dump({"name": "m", "store": str(tmp_path / "mixes::2"), "components": [
        {"dataset": f"{store}/t", "weight": 1}]}))
    assert cli.main(["mix", str(mix)]) == 0
    capsys.readouterr()
    from gristmill.manifests.mixture import load_data

    mixture = load_data(str(tmp_path / "mixes::2" / "m"))
    assert mixture.url == str(tmp_path / "mixes::2" / "m" / "v1")
    with Loader(mixture.url, Sampling(global_batch=2, seed=0)) as ld:  # the loader opens the mixture
        assert next(iter(ld))["tokens"].shape[0] == 2


def test_audit_leak_reads_an_eval_path_with_double_colons_as_a_local_file(tmp_path, capsys):
    from helpers import write_checkpoint_meta
    from test_audit_leak import build_text_dataset, words

    published, docs, *_ = build_text_dataset(str(tmp_path / "data"))
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), published, step=2, global_batch=4, world_size=2)
    ev = tmp_path / "evals::x.jsonl"
    _write_jsonl(ev, [{"text": words(docs[0])}])
    assert cli.main(["audit", "leak", ckpt, "--eval", str(ev), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["eval_file"] == str(ev)


# -- 3b. a mixture whose validation documents another component trains on --------------------------
@pytest.mark.slow
def test_a_mixture_of_two_differently_split_versions_is_refused_unless_allowed(plain_corpus, tmp_path, capsys):
    from gristmill.manifests.mixture import load_data

    out = tmp_path / "run"
    os.makedirs(out)
    split = {"validation_fraction": 0.3, "seed": 0}
    assert cli.main(["prepare", "--quiet", _job(plain_corpus, out, split=split, fuzzy_dedup={})]) == 0
    v1 = out / "store" / "t" / "v1"
    assert cli.main(["prepare", "--quiet", _job(plain_corpus, out, split={**split, "seed": 1}, fuzzy_dedup={},
                                                tokenizer={"path": str(v1 / "tokenizer.json")})]) == 0
    capsys.readouterr()
    job = {"name": "m", "store": str(out / "store"), "components": [
        {"dataset": "t", "version": 1, "name": "one", "weight": 1}, {"dataset": "t", "version": 2, "name": "two", "weight": 1}]}
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(job))
    assert cli.main(["mix", str(tmp_path / "mix.yaml")]) == 2
    err = _one_line(capsys.readouterr().err, "validation documents are in component", "training split", "allow_split_overlap")
    assert not os.path.exists(out / "store" / "m")
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump({**job, "allow_split_overlap": True}))
    assert cli.main(["mix", str(tmp_path / "mix.yaml")]) == 0
    assert "split overlap (allow_split_overlap: true)" in capsys.readouterr().out
    m = load_data(str(out / "store" / "m")).manifest  # hash-checked with the record in it
    pairs = {(o["validation"], o["training"]): o for o in m.split_overlaps}
    assert set(pairs) == {("one", "two"), ("two", "one")} and all(o["by"] == "content" for o in pairs.values())
    assert 0 < pairs[("one", "two")]["documents"] <= pairs[("one", "two")]["of"]
    assert "of component 'one'" in err


# -- 4. work_dir_options reach every read of the run dir; --print-config masks credentials --------
def test_decontamination_and_the_data_card_read_the_run_dir_with_work_dir_options(plain_corpus, tmp_path, capsys):
    """A work dir that opens only with its storage option (credentials nowhere else): the eval
    index the tasks load and report.html (read and written) must go through work_dir_options."""
    from test_storage import _ticketed

    from gristmill.manifests.storage import FsspecStore, Store

    _ticketed("gmticket4", "ok")
    try:
        (tmp_path / "ev.jsonl").write_text(json.dumps({"text": _texts(8, 30)[2]}) + "\n")
        out = tmp_path / "run"
        os.makedirs(out)
        job = _job(plain_corpus, out, work_dir=f"gmticket4://w-{uuid.uuid4().hex[:8]}", work_dir_options={"ticket": "ok"},
                   runner="serial", decontaminate={"eval_sets": [{"name": "ev", "path": str(tmp_path / "ev.jsonl")}]})
        doc = yaml.safe_load(open(job))
        doc["output"]["report_html"] = True
        open(job, "w").write(yaml.safe_dump(doc))
        assert cli.main(["prepare", job]) == 0
        err = capsys.readouterr().err
        assert "Traceback" not in err and "could not write" not in err, err[-3000:]
        store = Store.from_url(doc["work_dir"], ticket="ok")
        (run,) = [n for n in store.listdir(doc["work_dir"])]
        assert store.exists(f"{doc['work_dir']}/{run}/report.html")
    finally:
        FsspecStore.kinds.pop("gmticket4", None)


def test_print_config_masks_the_credentials_in_every_storage_option(plain_corpus, tmp_path, capsys):
    secrets = {f"SECRET{i}{uuid.uuid4().hex[:6]}" for i in range(6)}
    s = sorted(secrets)
    out = tmp_path / "run"
    os.makedirs(out)
    (tmp_path / "ev.jsonl").write_text('{"text": "x"}\n')
    job = _job([{**plain_corpus[0], "storage_options": {"token": s[0]}}], out,
               work_dir_options={"key": s[1], "secret": s[2], "client_kwargs": {"endpoint_url": "http://127.0.0.1:9",
                                                                                 "aws_session_token": s[3]}},
               decontaminate={"eval_sets": [{"name": "e", "path": str(tmp_path / "ev.jsonl"),
                                             "storage_options": {"account_key": s[4]}}]})
    doc = yaml.safe_load(open(job))
    doc["output"]["storage_options"] = {"password": s[5], "anon": False}
    open(job, "w").write(yaml.safe_dump(doc))
    assert cli.main(["prepare", job, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert not [x for x in secrets if x in printed], printed
    shown = yaml.safe_load(printed)
    assert shown["work_dir_options"]["client_kwargs"] == {"endpoint_url": "http://127.0.0.1:9", "aws_session_token": "<masked>"}
    assert shown["output"]["storage_options"] == {"password": "<masked>", "anon": False}
    assert shown["tokenizer"]["vocab_size"] == 300  # a key named like a secret outside storage options is not masked


# -- 5. a damaged run dir: one line naming the file and the way out (--fresh) ---------------------
def _run_dir(out) -> str:
    (run,) = glob.glob(str(out / "work" / "*" / "layout.json"))
    return os.path.dirname(run)


@pytest.mark.parametrize("tamper", ["other-blocks", "not-json", "damaged-block"])
def test_a_damaged_run_dir_is_one_line_with_the_way_out_and_fresh_takes_it(plain_corpus, tmp_path, capsys, tamper):
    out = tmp_path / "run"
    os.makedirs(out)
    job = _job(plain_corpus, out)
    assert cli.main(["prepare", "--quiet", job]) == 0
    run = _run_dir(out)
    if tamper == "other-blocks":
        (open(os.path.join(run, "layout.json"), "w")).write('{"block_parts": 3}')
    elif tamper == "not-json":
        (open(os.path.join(run, "layout.json"), "w")).write("nonsense{")
    else:  # a bit flipped in the middle of the extracted documents, read again by every later step
        from helpers import flip_byte

        flip_byte(os.path.join(run, "docs", "block-00000.parquet"))
        for name in os.listdir(os.path.join(run, "_done")):
            if name != "extract":
                shutil.rmtree(os.path.join(run, "_done", name))
    capsys.readouterr()
    for _ in range(2):  # a rerun fails the same way, and says so the same way
        assert cli.main(["prepare", "--quiet", job]) == 2
        _one_line(capsys.readouterr().err, "--fresh", "delete its run dir",
                  "docs/block-00000.parquet is damaged" if tamper == "damaged-block" else "layout.json")
    assert cli.main(["prepare", "--quiet", "--fresh", job]) == 0, capsys.readouterr().err
    assert cli.main(["prepare", "--quiet", job]) == 0  # the fresh run dir resumes as any other
    assert sorted(os.listdir(out / "store" / "t")) == ["latest", "v1"]


# -- 6. manifest verify: a doc id in two dedup index files ------------------------------------------
def test_manifest_verify_refuses_a_doc_id_in_two_dedup_index_files(earlier_version, tmp_path, capsys):
    from test_manifest_facts import forge

    from gristmill.manifests import load_manifest

    copy = tmp_path / "store" / "old" / "v1"
    shutil.copytree(earlier_version, copy)
    pub = load_manifest(str(copy))
    (ref,) = pub.manifest.dedup_index
    twin = ref.path.replace(".parquet", "-twin.parquet")
    shutil.copyfile(copy / ref.path, copy / twin)  # every id of the first file again, in a second one

    def edit(d):
        d["dedup_index"].append({**d["dedup_index"][0], "path": twin})

    forge(pub, edit)
    capsys.readouterr()
    assert cli.main(["manifest", "verify", str(copy)]) == 1  # each file alone verifies; together they do not
    text = "".join(capsys.readouterr())
    assert "dedup index holds doc_id" in text and "more than once" in text, text


# -- 7. the latest pointer: a directory in its place, a full disk exactly at its write ---------------
def test_a_latest_that_is_a_directory_is_refused_before_any_work(plain_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    os.makedirs(out / "store" / "t" / "latest")
    assert cli.main(["prepare", "--quiet", _job(plain_corpus, out)]) == 2
    _one_line(capsys.readouterr().err, "latest", "is a directory", "before any work")
    assert sorted(os.listdir(out / "store" / "t")) == ["latest"] and not os.path.exists(out / "work")


def test_a_failed_latest_write_after_the_commit_is_unambiguous_and_the_rerun_mends_it(plain_corpus, tmp_path, capsys,
                                                                                    monkeypatch):
    import errno

    from gristmill.manifests.storage import LocalStore
    from gristmill.manifests.store import ManifestStore

    out = tmp_path / "run"
    os.makedirs(out)
    assert cli.main(["prepare", "--quiet", _job(plain_corpus, out)]) == 0
    job2 = _job(plain_corpus, out, extract={"min_chars": 2})  # other content: v2
    real_put = LocalStore.put

    def full_at_latest(self, path, data, **kw):
        if path.endswith("/latest"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_put(self, path, data, **kw)

    monkeypatch.setattr(LocalStore, "put", full_at_latest)
    capsys.readouterr()
    assert cli.main(["prepare", "--quiet", job2]) == 2
    _one_line(capsys.readouterr().err, "t v2 is published", "No space left on device", "run the same command again",
              "nothing is published twice")
    store = ManifestStore(str(out / "store"))
    assert store.versions("t") == [1, 2] and store.latest("t") == 1  # the state the line describes
    monkeypatch.setattr(LocalStore, "put", real_put)
    assert cli.main(["prepare", "--quiet", job2]) == 0
    assert store.versions("t") == [1, 2] and store.latest("t") == 2  # mended, not published again


# -- 8. small edges: eval FIFOs named for what they are, non-UTF-8 paths, report --out, old run dirs,
#       a chained input URL, the dpkg lock -------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_eval_set_that_is_a_fifo_or_device_is_named_for_what_it_is(plain_corpus, tmp_path, capsys, kind):
    path = "/dev/zero" if kind == "device" else str(tmp_path / "ev.jsonl")
    if kind == "fifo":
        os.mkfifo(path)
    out = tmp_path / "run"
    os.makedirs(out)
    job = _job(plain_corpus, out, decontaminate={"eval_sets": [{"name": "e", "path": path, "format": "jsonl"}]})
    assert cli.main(["prepare", "--quiet", job]) == 2
    err = _one_line(capsys.readouterr().err, "a named pipe (FIFO)" if kind == "fifo" else "a character device",
                    "not a regular file")
    assert "does not exist" not in err


def test_a_work_dir_path_that_is_not_utf8_is_refused_before_any_work(plain_corpus, tmp_path, capsys):
    folder = os.path.join(os.fsencode(tmp_path), b"job\xff")
    os.makedirs(folder)
    job = _job(plain_corpus, tmp_path, work_dir="work")  # relative: resolved into the non-UTF-8 folder
    moved = os.path.join(folder, b"job.yaml")
    os.rename(job, moved)
    assert cli.main(["prepare", "--quiet", os.fsdecode(moved)]) == 2
    _one_line(capsys.readouterr().err, "work_dir: expected a path in UTF-8", "rename the folder")
    assert os.listdir(folder) == [b"job.yaml"]  # nothing was started


def test_report_out_to_a_folder_or_an_unwritable_place_is_one_line(plain_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    os.makedirs(out / "folder")
    assert cli.main(["prepare", "--quiet", _job(plain_corpus, out)]) == 0
    url = str(out / "store" / "t")
    assert cli.main(["report", url, "--out", str(out / "folder")]) == 0  # a folder: the page goes in it
    assert os.listdir(out / "folder") == ["t-v1.html"]
    capsys.readouterr()
    assert cli.main(["report", url, "--out", "/proc/x.html"]) == 2
    _one_line(capsys.readouterr().err, "--out /proc/x.html", "choose another --out")


def test_report_on_a_run_dir_of_the_earlier_layout_says_so(plain_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    os.makedirs(out)
    assert cli.main(["prepare", "--quiet", _job(plain_corpus, out)]) == 0
    run = _run_dir(out)
    os.rename(os.path.join(run, "docs", "block-00000.parquet"), os.path.join(run, "docs", "part-00000.parquet"))
    capsys.readouterr()
    assert cli.main(["report", str(out / "store" / "t"), "--work-dir", run, "--text"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "has its report.json, but is a run dir of an earlier gristmill" in text, text


def test_an_input_url_chain_that_cannot_be_opened_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    os.makedirs(out)
    assert cli.main(["prepare", "--quiet", _job([{"path": "zip://x::/nowhere/file.jsonl"}], out)]) == 2
    _one_line(capsys.readouterr().err, "inputs[0].path: zip://x::/nowhere/file.jsonl cannot be opened")


def test_setup_browser_waits_for_the_dpkg_lock(tmp_path):
    """A fake apt-get that fails as apt does while another apt holds the lock, unless told to wait
    (then "installs" Chromium); a fake id says root, so the script runs its apt path anywhere."""
    import subprocess

    bin_dir = tmp_path / "bin"
    os.makedirs(bin_dir)
    log = tmp_path / "apt.log"
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
echo "$@" >> {log}
case "$*" in
  *DPkg::Lock::Timeout=*install*) printf '#!/bin/sh\\n' > {bin_dir}/chromium; cp {bin_dir}/chromium {bin_dir}/chromedriver
                                  chmod +x {bin_dir}/chromium {bin_dir}/chromedriver; exit 0;;
  *DPkg::Lock::Timeout=*) exit 0;;
esac
echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1 (unattended-upgr)" >&2
exit 100
""")
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    for tool in ("apt-get", "id"):
        os.chmod(bin_dir / tool, 0o755)
    os.symlink(shutil.which("cp"), bin_dir / "cp")
    os.symlink(shutil.which("chmod"), bin_dir / "chmod")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "setup_browser.sh")
    r = subprocess.run(["/bin/sh", script], env={"PATH": str(bin_dir), "GRISTMILL_APT_LOCK_WAIT_S": "7"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all("DPkg::Lock::Timeout=7" in c for c in calls), calls


# -- 9. a Ray cluster address where nothing answers ---------------------------------------------------
def test_a_ray_address_where_nothing_answers_fails_in_one_line_within_the_connect_timeout(plain_corpus, tmp_path,
                                                                                          capsys, monkeypatch):
    import time

    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # the test session's Ray may already run in this worker (another file's fixture): a runner then uses it
    # and never dials the address; the check under test comes before any ray.init
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    out = tmp_path / "run"
    os.makedirs(out)
    job = _job(plain_corpus, out, runner={"kind": "ray", "address": "127.0.0.1:1", "connect_timeout_s": 3})
    t0 = time.monotonic()
    assert cli.main(["prepare", "--quiet", job]) == 2
    assert time.monotonic() - t0 < 30
    _one_line(capsys.readouterr().err, "cannot join the Ray cluster at 127.0.0.1:1", "nothing answers there after 3 s",
              "runner.connect_timeout_s")
    from gristmill.pipeline.config import RunnerConfig

    assert RunnerConfig(kind="ray").connect_timeout_s == 60  # the default: one line within a minute


# -- 10. an object store's file that fails to close when collected: not 30 lines on the terminal ------
def test_a_store_file_failing_to_close_when_collected_stays_off_the_terminal(tmp_path):
    import subprocess
    import sys

    code = """
import argparse, gc, sys
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from gristmill.cli.common import run
from gristmill.errors import GristmillError

class Gone(AbstractBufferedFile):  # s3fs's upload, its server gone (a moto server restarted empty)
    def _initiate_upload(self): pass
    def _upload_chunk(self, final=False): raise ConnectionError("the object store went away")

def handler(args):
    f = Gone(AbstractFileSystem(), "bucket/key", mode="wb")
    f.write(b"x" * 10)
    del f
    gc.collect()
    raise GristmillError("cannot publish: the object store went away")  # the command's own one line

sys.exit(run(argparse.Namespace(command="prepare", verbose=False), handler))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("gristmill prepare: error:"), r.stderr
