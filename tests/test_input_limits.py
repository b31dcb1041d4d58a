"""Hostile inputs of a few KB that once killed or hung a prepare (issue 26): every reader is bounded,
and anything past a bound is one quarantine record with its offset and reason."""
import gzip
import io
import json
import os
import re
import struct
import time
import tracemalloc
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from gristmill.errors import ConfigError
from gristmill.pipeline.config import PrepareConfig
from gristmill.pipeline.demo_corpus import _html, _warc_record
from gristmill.pipeline.readers import open_stream, read_records
from helpers import extract_files


def _page(n: int) -> bytes:
    return _warc_record(f"https://e.org/{n}", _html(f"Title {n}", [f"Paragraph {n} about mills and rivers."] * 3), n)


def _with_length(record: bytes, length: int) -> bytes:
    head, rest = record.split(b"\r\n\r\n", 1)
    lines = [b"Content-Length: %d" % length if x.startswith(b"Content-Length:") else x for x in head.split(b"\r\n")]
    return b"\r\n".join(lines) + b"\r\n\r\n" + rest


@pytest.mark.parametrize("length", [2 ** 70, 2 ** 40])
def test_a_warc_record_with_an_absurd_content_length_is_quarantined_at_its_offset(tmp_path, length):
    good = _page(0)
    p = tmp_path / "a.warc"
    p.write_bytes(good + _with_length(_page(1), length) + _page(2))
    stats, docs, quarantine = extract_files(str(tmp_path / "w"), [(str(p), "warc")])  # once: OverflowError here
    assert [d["position"] for d in docs] == [0]
    [q] = quarantine
    assert q["reason"] == "record_too_large" and q["offset"] == q["position"] == len(good)
    assert f"{length:,}" in q["detail"]
    assert q["raw"].startswith("WARC/1.0") if length == 2 ** 70 else "Title 1" in q["raw"]  # the header / the body's start
    assert stats["extract"]["records"] == 2


def test_a_warc_record_over_the_limit_is_skipped_and_the_next_one_read(tmp_path):
    big_page = _warc_record("https://e.org/big", _html("Big", ["A long paragraph about mills and rivers."] * 200), 1)
    records = [_page(0), big_page, _page(2)]
    p = tmp_path / "a.warc.gz"
    p.write_bytes(b"".join(gzip.compress(r, mtime=0) for r in records))
    lengths = [int(r.split(b"Content-Length: ")[1].split(b"\r\n")[0]) for r in records]  # the WARC header's (the first)
    recs = list(read_records(str(p), "warc", max_record_bytes=lengths[1] - 1))
    assert [r.get("reason") for r in recs] == [None, "record_too_large", None]
    assert [r["position"] for r in recs] == [0, len(records[0]), len(records[0]) + len(records[1])]
    assert f"{lengths[1]:,} bytes" in recs[1]["detail"] and "Big" in recs[1]["raw"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _parquet_claiming(tmp_path, rows: int, claim: int, columns=("text", "id")) -> str:
    """A Parquet file of ``rows`` rows whose footer (row counts and value counts) says ``claim``."""
    buf = io.BytesIO()
    pq.write_table(pa.table({c: [f"{c} {i}" for i in range(rows)] for c in columns}), buf, compression="none")
    data = buf.getvalue()
    n = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-8 - n:-8]
    assert footer.count(_varint(2 * rows)) >= 2  # zigzag varints of the counts (rows is chosen to be distinctive)
    footer = footer.replace(_varint(2 * rows), _varint(2 * claim))
    p = tmp_path / f"claim-{claim}.parquet"
    p.write_bytes(data[:-8 - n] + footer + struct.pack("<I", len(footer)) + b"PAR1")
    return str(p)


@pytest.mark.parametrize("text_field", ["text", "content"])  # content: a missing column once looped over the claim
def test_a_parquet_footer_claiming_2_60_rows_is_one_record_at_once(tmp_path, text_field):
    p = _parquet_claiming(tmp_path, 3001, 1 << 60)
    t0 = time.perf_counter()
    recs = list(read_records(p, "parquet", text_field, "id"))
    assert time.perf_counter() - t0 < 5
    assert [r["reason"] for r in recs] == ["corrupt_parquet"] and "cannot be true" in recs[0]["detail"]
    stats, docs, quarantine = extract_files(str(tmp_path / "w"), [(p, "parquet")], text_field=text_field)
    assert docs == [] and [q["reason"] for q in quarantine] == ["corrupt_parquet"]


def test_a_parquet_row_group_holding_fewer_rows_than_claimed_says_so(tmp_path):
    p = _parquet_claiming(tmp_path, 3001, 5003)
    recs = list(read_records(p, "parquet", "text", "id"))
    assert [r["position"] for r in recs[:-1]] == list(range(3001)) and all("text" in r for r in recs[:-1])
    assert recs[-1]["reason"] == "corrupt_parquet" and recs[-1]["position"] == 3001
    assert "not the 5,003" in recs[-1]["detail"]


def test_a_missing_text_column_is_one_record_per_row_group(tmp_path):
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"body": [f"b{i}" for i in range(10)]}), p, row_group_size=4)
    recs = list(read_records(str(p), "parquet", "text"))
    assert [(r["reason"], r["position"]) for r in recs] == [("missing_text_field", 0), ("missing_text_field", 4),
                                                            ("missing_text_field", 8)]
    assert all(r["offset"] is not None and r["end"] > r["offset"] for r in recs)


def _line_bomb(n: int, tail: bytes = b"") -> bytes:
    """A gzip of one JSON line of ``n`` bytes (highly compressible), then ``tail``; streamed."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(b'{"text": "')]
    chunk = b"a" * (1 << 20)
    for _ in range(n >> 20):
        out.append(z.compress(chunk))
    out.append(z.compress(b'"}\n' + tail))
    return b"".join(out) + z.flush()


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_a_line_past_the_limit_is_quarantined_in_bounded_memory(tmp_path, suffix):
    tail = b'{"text": "after the bomb"}\n'
    raw = _line_bomb(96 << 20, tail)  # 96 MiB line: ~100 KB compressed
    if suffix == ".zst":
        raw = zstandard.ZstdCompressor().compress(gzip.decompress(raw))
    p = tmp_path / f"bomb.jsonl{suffix}"
    p.write_bytes(raw)
    limit = 4 << 20
    tracemalloc.start()
    try:
        recs = list(read_records(str(p), "jsonl", max_record_bytes=limit))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    line = (96 << 20) + len(b'{"text": "') + 3
    assert [r.get("reason") for r in recs] == ["record_too_large", None]
    assert recs[0]["offset"] == 0 and recs[0]["end"] == line and recs[0]["raw"].startswith('{"text": "aaa')
    assert recs[1] == {"position": 1, "offset": line, "text": "after the bomb"}
    assert peak < 4 * limit, f"{peak:,} bytes at peak for a {limit:,}-byte limit"  # was ~4x the line


def test_a_text_file_past_the_limit_is_quarantined(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"x" * 5000)
    [r] = read_records(str(p), "text", max_record_bytes=4096)
    assert r["reason"] == "record_too_large" and r["offset"] == 0 and "4,096" in r["detail"]
    assert list(read_records(str(p), "text", max_record_bytes=5000))[0]["text"] == "x" * 5000


def test_a_parquet_value_past_the_limit_is_quarantined(tmp_path):
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["short", "y" * 10_000, "also short"]}), p)
    recs = list(read_records(str(p), "parquet", max_record_bytes=4096))
    assert [r.get("reason") for r in recs] == [None, "record_too_large", None] and recs[1]["position"] == 1


def test_the_limit_is_a_job_setting_with_a_default_and_bounds():
    job = {"inputs": ["/x/a.jsonl"], "output": {"store": "/s", "dataset": "d"}, "work_dir": "/w"}
    assert PrepareConfig.from_dict(job).extract.max_record_bytes == 64 << 20
    assert PrepareConfig.from_dict({**job, "extract": {"max_record_bytes": 1 << 20}}).extract.max_record_bytes == 1 << 20
    with pytest.raises(ConfigError, match=r"extract\.max_record_bytes: expected an integer in \[1024, "):
        PrepareConfig.from_dict({**job, "extract": {"max_record_bytes": 10}})


def test_high_ratio_zstd_reads_as_fast_as_gzip(tmp_path):
    """The decoder once copied its whole decoded chunk per read: zstd at ~1/60 of gzip's speed on
    the same high-ratio input. Compared in one run, as a ratio (not a time)."""
    data = b"".join(json.dumps({"text": "the same words again " * 40}).encode() + b"\n" for _ in range(40_000))
    files = {".zst": zstandard.ZstdCompressor(level=19).compress(data), ".gz": gzip.compress(data, 9)}
    speed = {}
    for suffix, raw in files.items():
        p = tmp_path / f"a.jsonl{suffix}"
        p.write_bytes(raw)
        with open(p, "rb") as f:
            t0 = time.perf_counter()
            assert sum(len(line) for line in open_stream(f, str(p))) == len(data)
            speed[suffix] = time.perf_counter() - t0
    assert speed[".zst"] < 4 * speed[".gz"] + 0.05, speed


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_input_that_is_not_a_regular_file_is_refused_before_any_work(tmp_path, kind):
    from gristmill.pipeline.executor import plan_inputs

    if kind == "fifo":
        path = tmp_path / "pipe.jsonl"
        os.mkfifo(path)
        what = "a named pipe (FIFO)"
    else:
        path = tmp_path / "null.jsonl"
        path.symlink_to("/dev/null")
        what = "a character device"
    (tmp_path / "ok.jsonl").write_text('{"text": "x"}\n')
    job = PrepareConfig.from_dict({"inputs": [str(tmp_path / "*.jsonl")], "output": {"store": str(tmp_path / "s"), "dataset": "d"},
                               "work_dir": str(tmp_path / "w")})
    with pytest.raises(ConfigError, match=rf"inputs\[0\]\.path: .*{os.path.basename(path)} .* is {re.escape(what)}, not a regular file"):
        plan_inputs(job)
    assert not (tmp_path / "w").exists()
