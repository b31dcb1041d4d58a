"""Hostile inputs, third round (issue 33): eval files read through the corpus readers' bounds, a
record no parser can hold, job values no reader accepts, manifest paths that are not plain paths,
forged checkpoint counts and dedup indexes. Each is one line (exit 2) or one quarantine record."""
import gzip
import io
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard

from helpers import build_dataset, extract_files, write_checkpoint_meta

from gristmill.cli import main
from gristmill.errors import ConfigError, GristmillError
from gristmill.pipeline.ngrams import EvalFileError, read_eval_items

MiB = 1 << 20


def _one_line(e) -> str:
    msg = str(e.value if hasattr(e, "value") else e)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


# -- 1. eval files: regular files only, bounded lines, the corpus readers' compressions ------------------
@pytest.mark.parametrize("kind", ["fifo", "device", "device-link"])
def test_an_eval_file_that_is_not_a_regular_file_is_one_line_not_a_hang(tmp_path, kind):
    if kind == "fifo":
        path = str(tmp_path / "pipe.jsonl")
        os.mkfifo(path)
    elif kind == "device":
        path = "/dev/zero"
    else:
        path = str(tmp_path / "zero.jsonl")
        os.symlink("/dev/zero", path)
    # in a child with a timeout: before the fix a FIFO blocked forever and /dev/zero grew without end
    code = textwrap.dedent(f"""
        import resource, sys
        from gristmill.pipeline.ngrams import EvalFileError, read_eval_items
        try:
            read_eval_items({path!r}, "jsonl")
        except EvalFileError as e:
            print("ERR", e)
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_AS, (2 << 30, 2 << 30)))
    assert r.returncode == 0 and r.stdout.startswith("ERR "), (r.stdout, r.stderr[-2000:])
    what = "a named pipe (FIFO)" if kind == "fifo" else "a character device"
    assert f"eval file {path}" in r.stdout and what in r.stdout and len(r.stdout.strip().splitlines()) == 1


def test_audit_leak_on_a_fifo_is_one_line_exit_2(tmp_path):
    from test_audit_leak import build_text_dataset

    published, *_ = build_text_dataset(str(tmp_path / "data"))
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), published, step=2, global_batch=4, world_size=2)
    fifo = str(tmp_path / "eval.jsonl")
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "gristmill", "audit", "leak", ckpt, "--eval", fifo], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert fifo in r.stderr and "named pipe" in r.stderr


def _zeros_gz(path, n: int) -> str:
    block = b"\0" * MiB
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(n // MiB):
            f.write(block)
    return str(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_an_eval_line_over_max_record_bytes_is_one_line_error(tmp_path, suffix):
    path = _zeros_gz(tmp_path / f"zeros{suffix}.gz", 8 * MiB)  # one 8 MiB line of NULs
    with pytest.raises(EvalFileError) as e:
        read_eval_items(path, max_record_bytes=MiB)
    msg = _one_line(e)
    assert f"eval file {path} line 1" in msg and "max_record_bytes" in msg


READ_BOUND_MB = 128  # what reading one hostile file may add: a 64 MiB line limit, read in 1 MiB pieces


def _peak_rss_mb(code: str) -> tuple[str, float]:
    """Run ``code`` in a fresh interpreter; its stdout and the memory the code's reads added (MB): the
    high-water mark VmHWM, reset after the imports (/proc/self/clear_refs), less VmRSS then. The
    imports' own size varies with the install (a fresh clone's is ~100 MB more than a warm one's), so
    the bound is on what the read adds (ru_maxrss would also carry over the forking pytest's)."""
    status = "next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith(%r)) / 1024"
    prologue = ("import gristmill.errors, gristmill.pipeline.ngrams\n"
                f"BASE = {status % 'VmRSS:'}\n"
                "open('/proc/self/clear_refs', 'w').write('5')\n")
    wrapped = prologue + code + f"\nprint('RSS', {status % 'VmHWM:'} - BASE)"
    r = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out, rss = r.stdout.rsplit("RSS ", 1)
    return out, float(rss)


@pytest.mark.parametrize("kind", ["gzip-bomb", "sparse"])
def test_a_huge_eval_line_costs_bounded_memory_at_the_default_limit(tmp_path, kind):
    if kind == "gzip-bomb":  # 160 MiB of zeros in ~160 KB (the report's 14 MB gzip decodes to 14 GB: same shape)
        path = _zeros_gz(tmp_path / "bomb.jsonl.gz", 160 * MiB)
    else:  # a 6 GB sparse file: no newline anywhere
        path = str(tmp_path / "sparse.jsonl")
        with open(path, "wb") as f:
            f.truncate(6 << 30)
    out, rss = _peak_rss_mb(textwrap.dedent(f"""
        from gristmill.pipeline.ngrams import EvalFileError, read_eval_items
        try:
            read_eval_items({path!r})
        except EvalFileError as e:
            print("ERR", e)
        """))
    assert out.startswith("ERR ") and "max_record_bytes" in out, out
    assert rss < READ_BOUND_MB, f"the read added {rss:.0f} MB"


def test_eval_files_read_the_compressions_inputs_do(tmp_path):
    lines = b"".join(json.dumps({"text": f"item {i} of the set"}).encode() + b"\n" for i in range(5))
    (tmp_path / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))  # was: UnsupportedOperation
    (tmp_path / "e.jsonl.gz").write_bytes(gzip.compress(lines))
    (tmp_path / "e.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"one\n\ntwo\n"))
    want = [(str(i), f"item {i} of the set") for i in range(5)]
    assert read_eval_items(str(tmp_path / "e.jsonl.zst")) == want == read_eval_items(str(tmp_path / "e.jsonl.gz"))
    assert read_eval_items(str(tmp_path / "e.txt.zst")) == [("0", "one"), ("1", "two")]
    (tmp_path / "cut.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines * 500)[:200])
    with pytest.raises(EvalFileError) as e:
        read_eval_items(str(tmp_path / "cut.jsonl.zst"))
    assert "truncated" in _one_line(e) and "cut.jsonl.zst" in str(e.value)


def test_a_parquet_eval_value_over_the_limit_is_one_line(tmp_path):
    path = str(tmp_path / "e.parquet")
    pq.write_table(pa.table({"text": ["short item", "x" * (2 * MiB)]}), path)
    with pytest.raises(EvalFileError) as e:
        read_eval_items(path, max_record_bytes=MiB)
    assert "row 1" in _one_line(e) and "max_record_bytes" in str(e.value)
    assert len(read_eval_items(path)) == 2


def test_a_huge_integer_in_an_eval_file_is_one_line(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "x", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(EvalFileError) as e:
        read_eval_items(str(path))
    assert f"eval file {path} line 2" in _one_line(e)


# -- 2. a record no parser can hold is quarantined, not fatal -------------------------------------------
def test_a_5000_digit_integer_is_quarantined_not_fatal(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"text": "first record here"}\n{"text": "second", "n": ' + "7" * 5000 + '}\n{"text": "third record"}\n')
    stats, docs, quarantine = extract_files(str(tmp_path / "w"), [(str(p), "jsonl")])
    assert [d["text"] for d in docs] == ["first record here", "third record"]
    assert [(q["reason"], q["position"]) for q in quarantine] == [("number_too_large", 1)]
    assert "4300" in quarantine[0]["detail"] or "digits" in quarantine[0]["detail"]


# -- 3. mix refuses what its readers refuse --------------------------------------------------------------
def test_mix_refuses_a_token_budget_no_reader_accepts(tmp_path, capsys):
    root = str(tmp_path)
    build_dataset(root, dataset="web", seed=1)
    job = tmp_path / "mix.yaml"
    job.write_text(yaml.safe_dump({"name": "big", "store": os.path.join(root, "store"),
                                   "components": [{"dataset": "web", "tokens": 10 ** 24}]}))
    assert main(["mix", str(job)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "components[0].tokens" in err, err
    assert not os.path.exists(os.path.join(root, "store", "big"))


# -- 4. manifest paths are plain relative paths ---------------------------------------------------------
@pytest.mark.parametrize("suffix", ["::zz", "::blockcache", ":x"])
def test_a_manifest_path_with_a_colon_is_refused_in_one_line(tmp_path, suffix, capsys):
    from test_manifest_facts import forge

    pub = build_dataset(str(tmp_path))

    def edit(d):
        d["shards"][0]["path"] += suffix

    forge(pub, edit)
    for cmd in (["manifest", "verify", pub.url], ["manifest", "show", pub.url]):
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "shards[0]" in err and suffix in err, err


# -- 5. a Parquet text column that is a list or struct has its own reason --------------------------------
def test_a_parquet_text_column_of_lists_or_structs_is_text_not_a_string(tmp_path):
    lists, structs = tmp_path / "l.parquet", tmp_path / "s.parquet"
    pq.write_table(pa.table({"text": [["a", "b"], None]}), lists)
    pq.write_table(pa.table({"text": [{"x": "a"}]}), structs)
    from gristmill.pipeline.readers import read_records

    assert [r.get("reason") for r in read_records(str(lists), "parquet")] == ["text_not_a_string", "missing_text_field"]
    assert [r.get("reason") for r in read_records(str(structs), "parquet")] == ["text_not_a_string"]


# -- 6. pack.range_tokens cannot make one task per token ------------------------------------------------
def test_pack_range_tokens_below_a_row_is_a_config_error(tmp_path):
    from gristmill.pipeline.config import PrepareConfig

    with pytest.raises(ConfigError) as e:
        PrepareConfig.from_dict({"inputs": [str(tmp_path / "*.jsonl")], "output": {"store": str(tmp_path / "s"), "dataset": "d"},
                                 "work_dir": str(tmp_path / "w"), "pack": {"seq_len": 128, "range_tokens": 1}})
    assert "pack.range_tokens" in _one_line(e)


def test_pack_plans_a_bounded_number_of_tasks(tmp_path):
    from gristmill.pipeline.stages.pack import tasks as pack

    assert pack.MAX_PACK_TASKS <= 1 << 18
    with pytest.raises(ConfigError) as e:
        pack.plan_ranges({"train": [(pack.MAX_PACK_TASKS + 1) * 2048], "validation": []}, 2048)
    assert "pack.range_tokens" in _one_line(e)
    assert len(pack.plan_ranges({"train": [10 ** 6], "validation": [10]}, 2048)) == 489 + 1


# -- 7. a file name with a control character ------------------------------------------------------------
def test_an_input_file_name_with_a_newline_is_refused_before_any_work(tmp_path):
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import plan_inputs

    (tmp_path / "ok.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "forged\n0\tok.jsonl").write_text('{"text": "y"}\n')
    job = PrepareConfig.from_dict({"inputs": [str(tmp_path / "*.jsonl")], "output": {"store": str(tmp_path / "s"), "dataset": "d"},
                                   "work_dir": str(tmp_path / "w")})
    with pytest.raises(ConfigError) as e:
        plan_inputs(job)
    assert "control character" in _one_line(e) and "forged\\n0\\tok.jsonl" in str(e.value)


def test_inspect_removed_prints_an_id_with_a_newline_on_its_own_line(tmp_path):
    from gristmill.cli.inspection import format_removed

    forged = "x.jsonl:0\n[2] contaminated (decontaminate)  forged"
    result = {"run_dir": "r", "removed_by_reason": {"exact_duplicate": 1},
              "documents": [{"reason": "exact_duplicate", "stage": "exact_dedup", "id": forged, "source": "a\nb.jsonl",
                             "position": 0, "url": "http://e.org/\r\n[3]", "detail": {}, "text": "some text",
                             "survivor": {"id": "y\n[4] z", "text": "some text"}}]}
    out = format_removed(result)
    assert not any(line.startswith(("[2]", "[3]", "[4]", "b.jsonl")) for line in out.splitlines()), out
    assert "x.jsonl:0\\n[2]" in out and "a\\nb.jsonl:0" in out and "survivor y\\n[4] z" in out


# -- 8. a checkpoint's token count is checked -----------------------------------------------------------
@pytest.mark.parametrize("tokens_seen", [-1, 5, "many"])
def test_audit_seen_refuses_a_resealed_meta_with_a_wrong_token_count(toy_dataset, tmp_path, capsys, tokens_seen):
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), toy_dataset, step=2, tokens_seen=tokens_seen)
    assert main(["audit", "seen", ckpt]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tokens_seen" in err, err


def test_a_negative_step_is_refused(toy_dataset, tmp_path):
    from helpers import reseal_meta

    from gristmill.trainer.meta import CheckpointError, read_meta

    ckpt = write_checkpoint_meta(str(tmp_path / "run"), toy_dataset, step=1)

    def edit(m):  # every count moved together: only the sign is wrong
        m.update(step=-1, tokens_seen=-m["tokens_seen"])
        m["loader"]["next_index"] = -m["loader"]["next_index"]

    reseal_meta(ckpt, edit)
    with pytest.raises(CheckpointError, match="step"):
        read_meta(ckpt)


# -- 9. a dedup index's doc_ids are sorted and unique ---------------------------------------------------
@pytest.mark.parametrize("ids", [["d2", "d1", "d3"], ["d1", "d1", "d1"]])
def test_a_dedup_index_with_unsorted_or_repeated_ids_is_refused(tmp_path, ids):
    from gristmill.manifests import dedup_index as dx
    from gristmill.manifests.errors import ManifestError
    from gristmill.manifests.hashing import sha256_bytes
    from gristmill.manifests.manifest import FileRef
    from gristmill.pipeline import dedup_index as di
    from gristmill.pipeline.stages.fuzzy_dedup.config import FuzzyDedupConfig

    params = di.index_params(FuzzyDedupConfig())
    path = str(tmp_path / "part.parquet")
    dx.write(path, di.index_rows(params, ids, ["some text here"] * 3))
    with open(path, "rb") as f:
        data = f.read()
    with pytest.raises(ManifestError, match="doc_id") as e:
        dx.read_checked(data, FileRef("dedup_index/part-00000.parquet", sha256_bytes(data), len(data), 3), "x")
    _one_line(e)


# -- 10. the accounting file goes through the work dir's storage -----------------------------------------
def test_an_unbalanced_accounting_on_an_object_store_work_dir_is_the_accounting_error(tmp_path):
    import fsspec

    from gristmill.pipeline.stats import AccountingError, check_balanced
    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir("memory://hostile3/work")
    accounting = {"balanced": False, "input": 3, "kept": 1, "removed": {"x": 1}, "quarantined": {}}
    with pytest.raises(AccountingError) as e:
        check_balanced(accounting, wd)
    assert "accounting does not balance" in _one_line(e)
    fs = fsspec.filesystem("memory")
    with fs.open(wd.accounting_json.split("://", 1)[1]) as f:
        assert json.load(f)["input"] == 3


def test_an_accounting_file_that_cannot_be_written_still_reports_the_accounting_error(tmp_path, monkeypatch):
    from gristmill.pipeline.stats import AccountingError, check_balanced
    from gristmill.pipeline.workdir import WorkDir

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    wd = WorkDir(str(tmp_path / "w"))
    monkeypatch.setattr(type(wd.store), "put", full_disk)  # the run dir's store: every write of it
    accounting = {"balanced": False, "input": 3, "kept": 1, "removed": {"x": 1}, "quarantined": {}}
    with pytest.raises(AccountingError) as e:
        check_balanced(accounting, wd)
    assert "accounting does not balance" in _one_line(e) and "failed too" in str(e.value)


# -- 11. fuzz: eval files and manifest paths -----------------------------------------------------------
FUZZ_SEED = 33


def _eval_fuzz_cases(rng):
    """(name, bytes) eval files, each damaged or crafted in one way."""
    good = b"".join(json.dumps({"text": f"item {i} of a question set", "id": i}).encode() + b"\n" for i in range(40))
    text = b"".join(b"line %d of an eval text\n" % i for i in range(40))
    for i in range(12):
        yield f"random-{i}.jsonl", rng.bytes(int(rng.integers(0, 3000)))
        yield f"random-{i}.txt", rng.bytes(int(rng.integers(0, 3000)))
        yield f"random-{i}.jsonl.gz", rng.bytes(int(rng.integers(0, 3000)))
        yield f"random-{i}.jsonl.zst", rng.bytes(int(rng.integers(0, 3000)))
        yield f"random-{i}.parquet", b"PAR1" + rng.bytes(int(rng.integers(0, 3000))) + b"PAR1"
    for cut in sorted(rng.integers(0, 400, 8).tolist()):
        yield f"cut-{cut}.jsonl.gz", gzip.compress(good, mtime=0)[:cut]
        yield f"cut-{cut}.jsonl.zst", zstandard.ZstdCompressor().compress(good)[:cut]
        yield f"cut-{cut}.txt.gz", gzip.compress(text, mtime=0)[:cut]
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"item {i}" for i in range(50)]}), buf)
    pqb = buf.getvalue()
    for cut in sorted(rng.integers(0, len(pqb), 6).tolist()):
        yield f"cut-{cut}.parquet", pqb[:cut]
    for i in range(8):  # a flipped byte anywhere
        for name, data in (("jsonl.gz", gzip.compress(good, mtime=0)), ("jsonl.zst", zstandard.ZstdCompressor().compress(good)),
                           ("parquet", pqb)):
            b = bytearray(data)
            b[int(rng.integers(0, len(b)))] ^= 0xFF
            yield f"flip-{i}.{name}", bytes(b)
    yield "nul.jsonl", good[:100] + b"\0" * 5000 + b"\n" + good
    yield "nul.txt", b"\0" * 3000
    yield "nul-line.jsonl", b'{"text": "a\\u0000b"}\n'
    yield "invalid-utf8.jsonl", good[:50] + b"\xff\xfe" + good[50:]
    yield "invalid-utf8.txt", text[:70] + b"\xc3\x28" + text[70:]
    yield "lone-surrogate.jsonl", b'{"text": "x \\ud800 y"}\n'
    yield "huge-line.jsonl", b'{"text": "' + b"w " * 40_000 + b'"}\n'  # over the test's 64 KiB limit
    yield "huge-line.txt", b"w" * 70_000
    yield "huge-paragraph.txt", b"w\n" * 40_000
    yield "deep-array.jsonl", b"[" * 100_000 + b"\n"
    yield "deep-object.jsonl", b'{"text": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001 + b"\n"
    yield "deep-list-text.jsonl", b'{"text": ' + b"[" * 900 + b'"x"' + b"]" * 900 + b"}\n"  # parses; joined recursively
    yield "deep-dict-text.jsonl", b'{"text": ' + b'{"a": ' * 900 + b"1" + b"}" * 901 + b"\n"  # parses; str() recurses
    yield "huge-int.jsonl", b'{"text": "x", "id": ' + b"1" * 5000 + b"}\n"
    yield "huge-float.jsonl", b'{"text": "x", "n": 1e999999}\n'
    yield "not-object.jsonl", b"[1, 2]\n\"s\"\nnull\n"
    yield "empty.jsonl", b""
    yield "empty.jsonl.gz", b""
    yield "empty.parquet", b""


def test_fuzzed_eval_files_are_items_or_one_line_errors(tmp_path):
    rng = np.random.default_rng(FUZZ_SEED)
    outcomes = {"items": 0, "error": 0}
    for name, data in _eval_fuzz_cases(rng):
        path = tmp_path / name
        path.write_bytes(data)
        try:
            items = read_eval_items(str(path), max_record_bytes=64 << 10)
        except GristmillError as e:
            msg = _one_line(e)
            assert str(path) in msg, (name, msg)
            outcomes["error"] += 1
        else:  # anything read is items of text
            assert all(isinstance(i, str) and isinstance(t, str) for i, t in items), name
            outcomes["items"] += 1
    assert outcomes["error"] > 100 and outcomes["items"] > 3, outcomes


def test_fuzzed_eval_files_cost_bounded_memory(tmp_path):
    """The worst shapes at the default limit, in one child: its peak RSS (VmHWM)."""
    cases = {"bomb.jsonl.zst": None, "bomb.txt.gz": None, "deep.jsonl": b"[" * (8 << 20) + b"\n",
             "nuls.jsonl": b"\0" * (96 << 20)}
    c = zstandard.ZstdCompressor().compressobj()
    with open(tmp_path / "bomb.jsonl.zst", "wb") as f:
        for _ in range(160):
            f.write(c.compress(b"x" * MiB))
        f.write(c.flush())
    _zeros_gz(tmp_path / "bomb.txt.gz", 160 * MiB)
    for name, data in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
    out, rss = _peak_rss_mb(textwrap.dedent(f"""
        from gristmill.errors import GristmillError
        from gristmill.pipeline.ngrams import read_eval_items
        for name in {sorted(cases)!r}:
            try:
                read_eval_items({str(tmp_path)!r} + "/" + name)
                print("ITEMS", name)
            except GristmillError as e:
                print("ERR", name, str(e).replace("\\n", " ")[:200])
        """))
    assert sorted(line.split()[1] for line in out.splitlines()) == sorted(cases), out
    print(f"the reads added {rss:.0f} MB")
    assert rss < READ_BOUND_MB, f"the reads added {rss:.0f} MB: {out}"


PATH_PIECES = ["shards", "train-00000.arrow", "a", "..", ".", "", "::", ":", "s3://b/k", "file://", "/", "\\", "\x00",
               "\n", "\t", "\x7f", "%2e%2e", "~", "C:", "memory://x", "blockcache::", "é", "\u202e", "x" * 300, "a b", "*", "?"]


def test_fuzzed_manifest_shard_paths_are_plain_relative_paths_or_one_line_errors(tmp_path, capsys):
    from test_manifest_facts import forge

    from gristmill.manifests import ManifestError, load_manifest

    pub = build_dataset(str(tmp_path))
    original = pub.manifest.shards[0].path
    rng = np.random.default_rng(FUZZ_SEED)
    refused = 0
    for i in range(60):
        path = "".join(rng.choice(PATH_PIECES, int(rng.integers(1, 5))).tolist()) if i else original + "::zz"

        def edit(d, path=path):
            d["shards"][0]["path"] = path

        forge(pub, edit)
        try:
            m = load_manifest(pub.url).manifest
        except ManifestError as e:
            _one_line(e)
            refused += 1
            assert main(["manifest", "verify", pub.url]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "shards[0]" in err, (path, err)
            continue
        p = m.shards[0].path  # accepted: a plain relative path inside the version directory
        segs = p.split("/")
        assert not p.startswith("/") and ":" not in p and "\\" not in p and not any(ord(c) < 0x20 or c == "\x7f" for c in p)
        assert all(s not in ("", ".", "..") for s in segs), p
        assert main(["manifest", "verify", pub.url]) in (0, 1)  # a missing file is a problem listed, not a crash
        capsys.readouterr()
    assert refused > 30
