"""Readers and the job file: every bad record is reported, every bad option is named."""
import gzip
import io
import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from gristmill.errors import ConfigError
from gristmill.pipeline.config import PrepareConfig, load_job
from gristmill.pipeline.demo_corpus import _gz, _html, _warc_record
from gristmill.pipeline.readers import PIECE, read_records
from helpers import extract_files


def _lines(n):
    rng = random.Random(0)  # incompressible enough that the compressed files have many blocks
    return b"".join(json.dumps({"text": f"document number {i}" if i < 5 else " ".join(
        f"{rng.getrandbits(40):x}" for _ in range(20)), "id": f"d{i}"}).encode() + b"\n" for i in range(n))


@pytest.mark.parametrize("suffix,compress", [("", lambda b: b), (".gz", lambda b: gzip.compress(b, mtime=0)),
                                             (".zst", lambda b: zstandard.ZstdCompressor().compress(b))])
def test_jsonl_plain_and_compressed(tmp_path, suffix, compress):
    p = tmp_path / f"a.jsonl{suffix}"
    p.write_bytes(compress(_lines(5)))
    recs = list(read_records(str(p), "jsonl", "text", "id"))
    assert [r["position"] for r in recs] == [0, 1, 2, 3, 4]
    offset = sum(len(line) + 1 for line in _lines(5).split(b"\n")[:3])  # of the line, in the uncompressed stream
    assert recs[3] == {"position": 3, "offset": offset, "text": "document number 3", "user_id": "d3"}


@pytest.mark.parametrize("suffix,compress", [(".gz", lambda b: gzip.compress(b, mtime=0)),
                                             (".zst", lambda b: zstandard.ZstdCompressor().compress(b))])
def test_truncated_compressed_file_ends_with_a_truncated_record(tmp_path, suffix, compress):
    data = compress(_lines(2000))
    p = tmp_path / f"cut.jsonl{suffix}"
    p.write_bytes(data[: len(data) // 2])
    recs = list(read_records(str(p), "jsonl"))
    good, last = recs[:-1], recs[-1]
    assert 0 < len(good) < 2000 and all("text" in r for r in good[:-1])
    assert last["reason"] == "truncated" and last["position"] == len(good)
    assert last["offset"] == sum(len(line) + 1 for line in _lines(2000).split(b"\n")[:len(good)])  # where the rest begins


def test_bad_jsonl_records_are_reported_not_dropped(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"text": "ok"}\n{"text": "broken\n\n{"text": "bad \xff utf8"}\n{"body": "x"}\n[1, 2]\n{"text": 3}\n')
    recs = list(read_records(str(p), "jsonl"))
    assert [r.get("reason") for r in recs] == [None, "malformed_json", "invalid_utf8", "missing_text_field",
                                               "malformed_json", "text_not_a_string"]
    assert [r["position"] for r in recs] == [0, 1, 2, 3, 4, 5]  # the blank line is not a record
    assert "broken" in recs[1]["raw"]


def test_parquet_text_field_nulls_and_missing_column(tmp_path):
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"content": ["one", None, "three"], "doc_id": ["x", "y", "z"]}), p)
    recs = list(read_records(str(p), "parquet", "content", "doc_id"))
    assert recs[0] == {"position": 0, "text": "one", "user_id": "x"}
    assert recs[1]["reason"] == "missing_text_field" and recs[2]["text"] == "three"
    missing = list(read_records(str(p), "parquet", "text"))  # one record per row group: footer counts are claims
    assert [(r["reason"], r["position"]) for r in missing] == [("missing_text_field", 0)]
    assert "rows 0-2" in missing[0]["detail"]


def test_text_file_is_one_document_and_invalid_utf8_is_quarantined(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    (tmp_path / "b.txt").write_bytes(b"bad \xff")
    assert list(read_records(str(tmp_path / "a.txt"), "text")) == [{"position": 0, "offset": 0, "text": "hello world"}]
    assert list(read_records(str(tmp_path / "b.txt"), "text"))[0]["reason"] == "invalid_utf8"


def test_warc_html_to_main_text_with_byte_offsets(tmp_path):
    records = [_warc_record(f"https://e.org/{i}", _html(f"Title {i}", [f"Paragraph {i} about mills and rivers."] * 3), i)
               for i in range(3)]
    p = tmp_path / "w.warc.gz"
    p.write_bytes(b"".join(_gz(r) for r in records))
    recs = list(read_records(str(p), "warc"))
    assert [r["url"] for r in recs] == [f"https://e.org/{i}" for i in range(3)]
    offsets = [0, len(records[0]), len(records[0]) + len(records[1])]
    assert [r["position"] for r in recs] == offsets  # byte offset in the uncompressed WARC
    assert "Paragraph 1 about mills" in recs[1]["text"]
    assert "Privacy" not in recs[1]["text"] and "tracking" not in recs[1]["text"]  # footer and script dropped
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 100])
    cut = list(read_records(str(p), "warc"))
    assert cut[-1]["reason"] == "truncated" and len(cut) == 3


def _job(tmp_path, **extra):
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    d = {"inputs": [str(tmp_path / "in.jsonl")], "output": {"store": str(tmp_path / "s"), "dataset": "d"},
         "work_dir": str(tmp_path / "w"), **extra}
    return d


@pytest.mark.parametrize("extra,message", [
    ({"langauge": {}}, "langauge: expected one of the keys inputs, output, work_dir, work_dir_options, extract, language, "),
    ({"language": {"threshold": 1.5}}, "language.threshold: expected a number in [0, 1], got 1.5"),
    ({"language": {"allowed": []}}, "language.allowed: expected a non-empty list of strings, got []"),
    ({"pack": {"seq_len": "long"}}, "pack.seq_len: expected an integer in [1, 2147483646], got 'long'"),
    ({"split": {"validation_fraction": 1.0}}, "split.validation_fraction: expected a number in [0, 1), got 1.0"),
    ({"tokenizer": {"path": "/nonexistent/tok.json"}},
     "tokenizer.path: expected an existing tokenizer file, got '/nonexistent/tok.json', which does not exist"),
    ({"fuzzy_dedup": True}, "fuzzy_dedup: expected a mapping or null, got True"),
    ({"extract": {"min_chars": 5, "max_chars": 2}}, "extract.max_chars: expected an integer >= min_chars (5), got 2"),
])
def test_bad_options_are_named(tmp_path, extra, message):
    with pytest.raises(ConfigError) as e:
        PrepareConfig.from_dict(_job(tmp_path, **extra))
    assert message in str(e.value)


def test_job_file_errors_and_relative_paths(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_job(str(tmp_path / "nope.yaml"))
    (tmp_path / "bad.yaml").write_text("inputs: [unclosed\n")
    with pytest.raises(ConfigError, match="not readable YAML"):
        load_job(str(tmp_path / "bad.yaml"))
    (tmp_path / "c.jsonl.zst").write_bytes(b"")
    (tmp_path / "job.yaml").write_text("inputs: [c.jsonl.zst]\noutput: {store: store, dataset: d}\nwork_dir: work\n")
    job = load_job(str(tmp_path / "job.yaml"))
    assert job.inputs[0].path == str(tmp_path / "c.jsonl.zst") and job.inputs[0].format == "jsonl"
    assert job.work_dir == str(tmp_path / "work") and job.language.threshold == 0.65
    assert "work_dir" not in job.content_dict() and "store" not in job.content_dict()["output"]


def test_missing_input_and_bad_stage_section_fail_before_any_work(tmp_path):
    from gristmill.pipeline.executor import Executor

    d = _job(tmp_path)
    d["inputs"] = [str(tmp_path / "missing-*.jsonl")]
    with pytest.raises(ConfigError, match=r"inputs\[0\].path: no input file matches"):
        Executor(PrepareConfig.from_dict(d))
    with pytest.raises(ConfigError, match="fuzzy_dedup.threshold"):
        Executor(PrepareConfig.from_dict(_job(tmp_path, fuzzy_dedup={"threshold": 2.0})))
    assert not os.path.exists(tmp_path / "w" / "_done")


# -- hostile and broken input files: never an exception, every record accounted for ------------
def _reasons(recs):
    return [r.get("reason") for r in recs]


def test_lone_surrogate_is_quarantined_and_the_other_records_are_kept(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_bytes(b'{"text": "fine one", "id": "a"}\n{"text": "bad \\ud800 half", "id": "b"}\n'
                  b'{"text": "ok", "id": "\\udfff"}\n{"text": "fine two", "id": "d"}\n')
    stats, docs, quarantine = extract_files(str(tmp_path / "w"), [(str(p), "jsonl")])
    assert [d["text"] for d in docs] == ["fine one", "ok", "fine two"]  # the id field is not used here
    assert [(q["position"], q["reason"]) for q in quarantine] == [(1, "lone_surrogate")]
    assert quarantine[0]["offset"] == len(b'{"text": "fine one", "id": "a"}\n') and "\\ud800" in quarantine[0]["raw"]
    assert stats["extract"]["records"] == stats["extract"]["documents"] + sum(stats["extract"]["quarantined"].values()) == 4
    _, docs, quarantine = extract_files(str(tmp_path / "w2"), [(str(p), "jsonl")], id_field="id")
    assert [d["id"] for d in docs] == ["a", "d"] and [(q["position"], q["reason"]) for q in quarantine] == [
        (1, "lone_surrogate"), (2, "lone_surrogate")]
    assert "id field 'id'" in quarantine[1]["detail"] and "the text" in quarantine[0]["detail"]


@pytest.mark.parametrize("name", ["a.jsonl.zst", "a.jsonl.gz", "a.txt.gz", "a.warc.gz"])
def test_a_file_that_is_not_what_its_extension_says_is_one_corrupt_compression_record(tmp_path, name):
    p = tmp_path / name
    p.write_bytes(b'{"text": "plain, not compressed"}\n' * 3)
    fmt = {"jsonl": "jsonl", "txt": "text", "warc": "warc"}[name.split(".")[1]]
    recs = list(read_records(str(p), fmt))
    assert _reasons(recs) == ["corrupt_compression"] and recs[0]["offset"] == 0


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_empty_compressed_file_is_truncated(tmp_path, suffix):
    p = tmp_path / f"e.jsonl{suffix}"
    p.write_bytes(b"")
    assert _reasons(read_records(str(p), "jsonl")) == ["truncated"]


def _decodable(kind, data):
    """The uncompressed bytes an independent decoder gets out of ``data`` (a prefix of a stream)."""
    import zlib

    if kind == ".gz":
        return zlib.decompressobj(wbits=31).decompress(data)
    return zstandard.ZstdDecompressor().decompressobj().decompress(data) if data else b""


@pytest.mark.parametrize("suffix,compress", [(".gz", lambda b: gzip.compress(b, mtime=0)),
                                             (".zst", lambda b: zstandard.ZstdCompressor(write_checksum=True).compress(b))])
def test_damage_inside_a_compressed_stream_keeps_every_record_before_it(tmp_path, suffix, compress):
    plain = _lines(3000)
    data = bytearray(compress(plain))
    at = len(data) // 2
    data[at:at + 64] = bytes(64)  # a damaged run of bytes mid-file
    p = tmp_path / f"d.jsonl{suffix}"
    p.write_bytes(bytes(data))
    recs = list(read_records(str(p), "jsonl", "text", "id"))
    assert recs[-1]["reason"] == "corrupt_compression"
    # everything an independent decoder reads from the bytes before the damaged piece is kept as it was
    # (after that, a gzip decoder may put out garbage before it notices: those lines are quarantined one by one)
    n = _decodable(suffix, bytes(data[: at // PIECE * PIECE])).count(b"\n")
    assert n > 0 and [r.get("text") for r in recs[:n]] == [json.loads(line)["text"] for line in plain.split(b"\n")[:n]]
    assert recs[-1]["position"] == len(recs) - 1 and recs[-1]["end"] is None
    assert recs[-1]["offset"] >= sum(len(line) + 1 for line in plain.split(b"\n")[:n])  # the rest starts after them


def _parquet(n_rows, group_rows, **kw):
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"row number {i} " + "x" * (i % 50) for i in range(n_rows)]}), buf,
                   row_group_size=group_rows, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("data,reason", [(b"", "truncated"), (b"PAR1 and then the file stops", "truncated"),
                                         (b"this is not parquet at all", "corrupt_parquet"), ("cut", "truncated")])
def test_an_unopenable_parquet_file_is_one_record_for_all_of_it(tmp_path, data, reason):
    if data == "cut":
        whole = _parquet(300, 100)
        data = whole[: len(whole) - 30]  # the footer is gone
    p = tmp_path / "x.parquet"
    p.write_bytes(data)
    recs = list(read_records(str(p), "parquet"))
    assert _reasons(recs) == [reason]
    assert (recs[0]["position"], recs[0]["offset"], recs[0]["end"]) == (0, 0, len(data))


def test_a_damaged_parquet_row_group_is_one_record_and_the_others_are_read(tmp_path):
    data = bytearray(_parquet(3000, 1000, compression="zstd"))
    meta = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    col = meta.row_group(1).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    lo, hi = start, start + col.total_compressed_size
    for i in range(lo + 40, hi - 40):  # the page payload of row group 1 (its headers stay readable)
        data[i] ^= 0x5A
    p = tmp_path / "d.parquet"
    p.write_bytes(bytes(data))
    recs = list(read_records(str(p), "parquet"))
    good = [r["position"] for r in recs if "reason" not in r]
    bad = [r for r in recs if "reason" in r]
    assert [b["reason"] for b in bad] == ["corrupt_parquet"] and "row group 1" in bad[0]["detail"]
    assert set(range(0, 1000)) <= set(good) and set(range(2000, 3000)) <= set(good)  # before and after the damage
    assert len(recs) == len(good) + 1 and bad[0]["position"] == len([g for g in good if g < 2000])
    assert (bad[0]["offset"], bad[0]["end"]) == (lo, hi)


def test_parquet_text_of_the_wrong_type_is_text_not_a_string_per_row(tmp_path):
    p = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": [[1, 2], [3], None]}), p)
    assert _reasons(read_records(str(p), "parquet")) == ["text_not_a_string"] * 2 + ["missing_text_field"]


def _warc(n):
    return [_warc_record(f"https://e.org/{i}", _html(f"Title {i}", [f"Paragraph {i} about mills and rivers."] * 3), i)
            for i in range(n)]


@pytest.mark.parametrize("damage", ["header", "length", "junk_start"])
@pytest.mark.parametrize("gz", [False, True])
def test_a_malformed_warc_record_ends_the_file_with_one_record_at_its_offset(tmp_path, damage, gz):
    recs = _warc(4)
    broken = {"header": recs[2].replace(b"WARC/1.0", b"WARX/1.0"),
              "length": recs[2].replace(b"\r\nContent-Length: ", b"\r\nContent-Length: x", 1),
              "junk_start": b"garbage before any record\r\n\r\n" + recs[2]}[damage]
    parts = [recs[0], recs[1], broken, recs[3]]
    p = tmp_path / ("w.warc.gz" if gz else "w.warc")
    p.write_bytes(b"".join(_gz(r) if gz else r for r in parts))
    out = list(read_records(str(p), "warc"))
    at = len(recs[0]) + len(recs[1])
    assert [r.get("url") for r in out[:2]] == ["https://e.org/0", "https://e.org/1"]
    assert _reasons(out) == [None, None, "malformed_warc"]
    assert out[2]["position"] == out[2]["offset"] == at
    assert out[2]["end"] == (None if gz else len(p.read_bytes()))  # the rest's end: known when not compressed
    assert out[2]["raw"].startswith(broken[:8].decode())


def test_a_plain_warc_cut_inside_a_record_is_truncated_there(tmp_path):
    recs = _warc(3)
    data = b"".join(recs)
    for cut in (len(recs[0]) + 40, len(recs[0]) + len(recs[1]) - 100):  # in the header, in the body
        p = tmp_path / "c.warc"
        p.write_bytes(data[:cut])
        out = list(read_records(str(p), "warc"))
        assert _reasons(out) == [None, "truncated"] and (out[1]["offset"], out[1]["end"]) == (len(recs[0]), cut)


def test_html_declared_utf8_that_is_latin1_is_quarantined_not_guessed(tmp_path):
    body = "<html><body><p>Le café est déjà prêt pour les invités de la maison.</p></body></html>"
    good = _warc_record("https://e.org/ok", body, 0)
    latin = good.replace(body.encode(), body.encode("latin-1")).replace(
        b"Content-Length: %d" % len(body.encode()), b"Content-Length: %d" % len(body.encode("latin-1")))
    head, _, http = latin.partition(b"\r\n\r\n")
    latin = head.replace(b"Content-Length: %d" % (len(good.partition(b"\r\n\r\n")[2]) - 4),
                         b"Content-Length: %d" % (len(http) - 4)) + b"\r\n\r\n" + http
    p = tmp_path / "l.warc"
    p.write_bytes(good + latin)
    out = list(read_records(str(p), "warc"))
    assert "café" in out[0]["text"]
    assert out[1]["reason"] == "charset_mismatch" and "utf-8" in out[1]["detail"] and out[1]["offset"] == len(good)


def test_every_input_problem_at_planning_is_one_line_exit_2_before_any_work(tmp_path, capsys):
    from gristmill.cli import main

    d = _job(tmp_path)
    (tmp_path / "loop-a.jsonl").symlink_to(tmp_path / "loop-b.jsonl")
    (tmp_path / "loop-b.jsonl").symlink_to(tmp_path / "loop-a.jsonl")
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "nowhere")
    (tmp_path / "dir.jsonl").mkdir()
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.jsonl"), "wb") as f:  # a latin-1 file name
        f.write(b'{"text": "x"}\n')
    cases = {"loop-*.jsonl": "a symlink loop", "dangling.jsonl": "a symlink to nothing",
             "di*.jsonl": "is a directory, not an input file", "caf*.jsonl": "is not valid UTF-8"}
    for pattern, message in cases.items():
        d["inputs"] = [str(tmp_path / "in.jsonl"), str(tmp_path / pattern)]
        job = tmp_path / "job.yaml"
        job.write_text(json.dumps(d))  # JSON is YAML
        assert main(["prepare", str(job)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err and "inputs[1].path" in err, err
    assert not os.path.exists(tmp_path / "w")


def test_embedded_ray_failing_to_start_is_one_actionable_error(tmp_path, monkeypatch):
    import ray

    from gristmill.errors import GristmillError
    from gristmill.pipeline.runners.ray import ray_runtime

    def fail(**kw):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

    shutdowns = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fail)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))  # never the session's Ray
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    job = PrepareConfig.from_dict(_job(tmp_path))
    with pytest.raises(GristmillError) as e:
        with ray_runtime(job.runner):
            pass
    msg = str(e.value)
    assert "embedded Ray did not start" in msg and "timed out during startup" in msg and "\n" not in msg
    assert "RAY_raylet_start_wait_time_s" in msg and "runner.num_cpus" in msg and shutdowns
    with pytest.raises(GristmillError, match="cannot join the Ray cluster at ray://head:10001"):
        with ray_runtime(job.runner, "ray://head:10001"):
            pass
