"""Readers and the job file: every bad record is reported, every bad option is named."""
import gzip
import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from gristmill.errors import ConfigError
from gristmill.pipeline.config import JobConfig, load_job
from gristmill.pipeline.demo_corpus import _gz, _html, _warc_record
from gristmill.pipeline.readers import read_records


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
    assert recs[3] == {"position": 3, "text": "document number 3", "user_id": "d3"}


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


def test_bad_jsonl_records_are_reported_not_dropped(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"text": "ok"}\n{"text": "broken\n\n{"text": "bad \xff utf8"}\n{"body": "x"}\n[1, 2]\n{"text": 3}\n')
    recs = list(read_records(str(p), "jsonl"))
    assert [r.get("reason") for r in recs] == [None, "malformed_json", "invalid_utf8", "missing_text_field",
                                               "malformed_json", "missing_text_field"]
    assert [r["position"] for r in recs] == [0, 1, 2, 3, 4, 5]  # the blank line is not a record
    assert "broken" in recs[1]["raw"]


def test_parquet_text_field_nulls_and_missing_column(tmp_path):
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"content": ["one", None, "three"], "doc_id": ["x", "y", "z"]}), p)
    recs = list(read_records(str(p), "parquet", "content", "doc_id"))
    assert recs[0] == {"position": 0, "text": "one", "user_id": "x"}
    assert recs[1]["reason"] == "missing_text_field" and recs[2]["text"] == "three"
    missing = list(read_records(str(p), "parquet", "text"))
    assert [r["reason"] for r in missing] == ["missing_text_field"] * 3


def test_text_file_is_one_document_and_invalid_utf8_is_quarantined(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    (tmp_path / "b.txt").write_bytes(b"bad \xff")
    assert list(read_records(str(tmp_path / "a.txt"), "text")) == [{"position": 0, "text": "hello world"}]
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
    ({"langauge": {}}, "langauge: expected one of the keys inputs, output, work_dir, extract, language, "),
    ({"language": {"threshold": 1.5}}, "language.threshold: expected a number in [0, 1], got 1.5"),
    ({"language": {"allowed": []}}, "language.allowed: expected a non-empty list of strings, got []"),
    ({"pack": {"seq_len": "long"}}, "pack.seq_len: expected an integer >= 1, got 'long'"),
    ({"split": {"validation_fraction": 1.0}}, "split.validation_fraction: expected a number in [0, 1), got 1.0"),
    ({"tokenizer": {"path": "/nonexistent/tok.json"}},
     "tokenizer.path: expected an existing tokenizer file, got '/nonexistent/tok.json', which does not exist"),
    ({"fuzzy_dedup": True}, "fuzzy_dedup: expected a mapping or null, got True"),
    ({"extract": {"min_chars": 5, "max_chars": 2}}, "extract.max_chars: expected an integer >= min_chars (5), got 2"),
])
def test_bad_options_are_named(tmp_path, extra, message):
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict(_job(tmp_path, **extra))
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
        Executor(JobConfig.from_dict(d))
    with pytest.raises(ConfigError, match="fuzzy_dedup.threshold"):
        Executor(JobConfig.from_dict(_job(tmp_path, fuzzy_dedup={"threshold": 2.0})))
    assert not os.path.exists(tmp_path / "w" / "_done")
