"""Fuzzing `gristmill prepare`'s inputs: hundreds of broken variants of every format the demo
corpus writes (JSONL plain/.gz/.zst, Parquet, text, WARC): truncations at random offsets,
flipped bytes, zeroed runs, inserted garbage, the wrong compression, wrong types, empty files.

Most variants go through ``extract_partition`` directly (the code prepare's extract tasks run,
no Ray); for each: it never raises, the accounting of the file is exact, and every record that
lies wholly before the damage is kept as it was. A few end-to-end ``prepare`` runs on a corpus
mixing damaged and good files check that the job finishes, the good records survive and the
report balances. Fixed seeds: the same variants every run."""
import gzip
import io
import json
import os
import random
import shutil
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from gristmill.pipeline.demo_corpus import _gz, _html, _jsonl, _warc_record, _zst
from gristmill.pipeline.readers import PIECE
from helpers import extract_files

pytestmark = pytest.mark.slow

SEED = 15
VARIANTS = 45  # per base file and kind of damage family below; 6 base files
REMAINDER = {"truncated", "corrupt_compression", "malformed_warc", "read_error"}  # the unreadable rest of a stream
REASONS = REMAINDER | {"corrupt_parquet", "malformed_json", "invalid_utf8", "lone_surrogate", "missing_text_field",
                       "text_not_a_string", "number_too_large",
                       "missing_id_field", "empty", "huge", "not_html", "invalid_html", "charset_mismatch"}
WORDS = ("mill river grain stone wheel water miller flour sack cart road bridge village market bread oven "
         "winter summer harvest field barley rye wheat valley hill wind sail ledger clerk toll lock canal").split()


def _texts(rng, n, tag):
    # random hex keeps compressed files several PIECEs long, so "before the damage" means something
    return [f"{tag} {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + " " +
            " ".join(f"{rng.getrandbits(32):08x}" for _ in range(rng.randint(5, 40))) for i in range(n)]


def _parquet(texts, group_rows=40):
    buf = io.BytesIO()  # as the demo writes it: zstd, text in column `content`
    pq.write_table(pa.table({"doc_id": [f"w{i}" for i in range(len(texts))], "content": texts}), buf,
                   compression="zstd", row_group_size=group_rows)
    return buf.getvalue()


def _warc_members(texts):
    return [_gz(_warc_record(f"https://example.org/page/{i}", _html(f"Page {i}", [t]), i)) for i, t in enumerate(texts)]


def base_files(tag="fuzz"):
    """{name: (bytes, format)}: one file of every kind the demo corpus writes."""
    rng = random.Random(SEED)
    def lines():  # distinct documents in every file (> one 128 KiB zstd block)
        return _jsonl([{"text": t} for t in _texts(rng, 700, tag)])

    return {
        f"{tag}.jsonl": (lines(), "jsonl"),
        f"{tag}.jsonl.gz": (_gz(lines()), "jsonl"),
        f"{tag}.jsonl.zst": (_zst(lines()), "jsonl"),
        f"{tag}.parquet": (_parquet(_texts(rng, 200, tag)), "parquet"),
        f"{tag}.txt": (" ".join(_texts(rng, 3, tag)).encode(), "text"),
        f"{tag}.warc.gz": (b"".join(_warc_members(_texts(rng, 90, tag))), "warc"),
    }


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n  # binary search on equal prefixes: variants are long
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def mutations(name: str, data: bytes, rng: random.Random):
    """(label, bytes) variants of one file."""
    yield "empty", b""
    for _ in range(VARIANTS):
        yield "cut", data[: rng.randrange(1, len(data))]
    for _ in range(VARIANTS):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= rng.randint(1, 255)
        yield "flip", bytes(b)
    for _ in range(VARIANTS // 3):
        b, at, k = bytearray(data), rng.randrange(len(data)), rng.randint(1, 300)
        b[at:at + k] = bytes(len(b[at:at + k]))
        yield "zeros", bytes(b)
    for _ in range(VARIANTS // 3):
        at = rng.randrange(len(data))
        yield "insert", data[:at] + rng.randbytes(rng.randint(1, 64)) + data[at:]
    if name.endswith(".warc.gz"):  # damage inside one record's member (recompressed): malformed WARC records
        members = _split_members(data)
        for _ in range(VARIANTS // 2):
            k = rng.randrange(len(members))
            plain = bytearray(gzip.decompress(members[k]))
            at = rng.randrange(len(plain))
            if rng.random() < 0.5:
                plain[at] ^= rng.randint(1, 255)
            else:
                plain[at:] = rng.randbytes(rng.randint(0, 40))
            yield "inner", b"".join(members[:k] + [_gz(bytes(plain))] + members[k + 1:])
    if name.endswith((".gz", ".zst", ".jsonl", ".txt")):  # the wrong compression for the extension
        plain = gzip.decompress(data) if name.endswith(".gz") else (
            zstandard.ZstdDecompressor().decompressobj().decompress(data) if name.endswith(".zst") else data)
        yield "plain", plain
        yield "as-gz", _gz(plain)
        yield "as-zst", _zst(plain)


def wrong_types(rng):
    """Files whose records have the wrong types: (name, bytes, format, {position: reason})."""
    cases = [({"text": 42}, "text_not_a_string"), ({"text": 3.5}, "text_not_a_string"),
             ({"text": [1, "a"]}, "text_not_a_string"), ({"text": {"nested": "x"}}, "text_not_a_string"),
             ({"text": None}, "missing_text_field"), ({"text": True}, "text_not_a_string"), ({"text": "  "}, "empty"),
             (42, "malformed_json"), (["a list"], "malformed_json"), ("a string", "malformed_json"), (None, "malformed_json")]
    recs, want = [], {}
    for i in range(60):
        if i % 4 == 1:
            value, want[i] = rng.choice(cases)
            recs.append(json.dumps(value).encode())
        else:
            recs.append(json.dumps({"text": f"good record {i}"}).encode())
    lines = b"\n".join(recs) + b"\n"
    yield "types.jsonl", lines, "jsonl", want
    yield "types.jsonl.zst", _zst(lines), "jsonl", want
    for kind, col in [("int", pa.array(range(30), pa.int64())), ("list", pa.array([[i] for i in range(30)])),
                      ("struct", pa.array([{"a": i} for i in range(30)])), ("binary", pa.array([b"x"] * 30, pa.binary()))]:
        buf = io.BytesIO()
        pq.write_table(pa.table({"content": col}), buf)
        yield f"types-{kind}.parquet", buf.getvalue(), "parquet", {i: "text_not_a_string" for i in range(30)}


# -- oracles --------------------------------------------------------------------------------
def _decodable(name: str, prefix: bytes) -> bytes:
    """What an independent decoder gets out of the first bytes of a compressed stream."""
    if name.endswith(".gz"):
        out, rest = b"", prefix
        while rest:
            d = zlib.decompressobj(wbits=31)
            try:
                out += d.decompress(rest)
            except zlib.error:
                break
            if not d.eof:
                break
            rest = d.unused_data
        return out
    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(prefix) if prefix else b""
    except zstandard.ZstdError:
        return b""


def intact_positions(name: str, fmt: str, original: bytes, variant: bytes, base_docs: dict) -> set:
    """Positions of the original's records that lie wholly before the first changed byte: they must be kept."""
    x = _common_prefix(original, variant)
    if fmt == "jsonl":
        plain = original
        if name.endswith((".gz", ".zst")):  # in the uncompressed stream: what the pieces before the damaged one hold
            plain, x = _decodable(name, original), len(_decodable(name, variant[: x // PIECE * PIECE]))
        end, out = 0, set()
        for i, line in enumerate(plain.split(b"\n")[:-1]):
            end += len(line) + 1
            if end <= x:
                out.add(i)
        return out
    if fmt == "text":
        return {0} if variant == original else set()
    if fmt == "warc":  # one gzip member per record: the members that end before the damaged piece
        end, out, limit = 0, set(), x // PIECE * PIECE
        for member, pos in zip(base_docs["members"], sorted(base_docs["docs"])):
            end += len(member)
            if end <= limit:
                out.add(pos)
        return out
    try:  # parquet: the row groups before the damage, if the footer still describes them as it did
        a, b = pq.ParquetFile(io.BytesIO(original)).metadata, pq.ParquetFile(io.BytesIO(variant)).metadata
        if a.schema != b.schema:
            return set()
    except Exception:
        return set()
    out, first = set(), 0
    for g in range(a.num_row_groups):
        ga = a.row_group(g).to_dict()
        try:
            same = g < b.num_row_groups and b.row_group(g).to_dict() == ga
        except Exception:  # a footer damaged in this row group's entry (e.g. its statistics)
            same = False
        hi = max(c["data_page_offset"] + c["total_compressed_size"] for c in ga["columns"])
        if same and hi <= x:
            out |= set(range(first, first + ga["num_rows"]))
        first += ga["num_rows"]
    return out


def check_file(work, path: str, fmt: str, name: str, original: bytes, base_docs: dict, label: str) -> None:
    variant = open(path, "rb").read()
    shutil.rmtree(work, ignore_errors=True)
    stats, docs, quarantine = extract_files(work, [(path, fmt)], text_field="content" if fmt == "parquet" else "text")
    what = f"{name} [{label}, {len(variant)} bytes]"
    ex = stats["extract"]
    # exact accounting of the file: every record is kept or quarantined, once
    assert ex["records"] == ex["documents"] + sum(ex["quarantined"].values()), what
    assert len(docs) == ex["documents"] and len(quarantine) == sum(ex["quarantined"].values()), what
    positions = [d["position"] for d in docs] + [q["position"] for q in quarantine]
    assert len(set(positions)) == len(positions) == ex["records"], what
    for q in quarantine:
        assert q["reason"] in REASONS and q["source"] == path and isinstance(q["position"], int), (what, q)
    rest = [q for q in quarantine if q["reason"] in REMAINDER or (fmt == "parquet" and q["reason"] == "corrupt_parquet")]
    if fmt != "parquet":  # a stream: at most one record for its unreadable rest, after every other record
        assert len(rest) <= 1 and (not rest or rest[0]["position"] == max(positions)), (what, rest)
        assert not rest or rest[0]["offset"] is not None, (what, rest)
    # what was read before the damage is kept, as it was
    kept = {d["position"]: d["text"] for d in docs}
    for p in intact_positions(name, fmt, original, variant, base_docs):
        assert kept.get(p) == base_docs["docs"][p], (what, p)
    # independent decoders: a file they read whole has no "rest" record, one they cannot read has one
    if fmt == "jsonl" and name.endswith((".jsonl", ".gz")):
        try:
            plain = gzip.decompress(variant) if name.endswith(".gz") and variant else variant
        except (OSError, EOFError, ValueError, zlib.error):
            plain = None
        if plain is None or (name.endswith(".gz") and not variant):
            assert len(rest) == 1, what
        else:
            assert not rest and ex["records"] == sum(1 for line in plain.split(b"\n") if line.strip()), what
    if fmt == "parquet":
        try:
            rows = pq.read_table(io.BytesIO(variant), columns=["content"]).num_rows
        except Exception:
            rows = None
        if rows is not None:
            assert not rest and ex["records"] == rows, what
        else:
            assert rest, what


def test_hundreds_of_damaged_files_never_fail_the_extract_task_and_account_for_every_record(tmp_path):
    rng = random.Random(SEED)
    n = 0
    for name, (data, fmt) in base_files().items():
        base = tmp_path / "base" / name
        base.parent.mkdir(parents=True, exist_ok=True)
        base.write_bytes(data)
        _, docs, quarantine = extract_files(str(tmp_path / "w-base"), [(str(base), fmt)],
                                            text_field="content" if fmt == "parquet" else "text")
        shutil.rmtree(tmp_path / "w-base")
        assert docs and not quarantine  # the base file is clean
        base_docs = {"docs": {d["position"]: d["text"] for d in docs}, "members": _split_members(data) if fmt == "warc" else None}
        for i, (label, variant) in enumerate(mutations(name, data, rng)):
            p = tmp_path / "v" / f"{i:03d}-{name}"
            p.parent.mkdir(exist_ok=True)
            p.write_bytes(variant)
            check_file(str(tmp_path / "w"), str(p), fmt, name, data, base_docs, label)
            n += 1
    for name, data, fmt, want in wrong_types(rng):
        p = tmp_path / "t" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        shutil.rmtree(tmp_path / "w", ignore_errors=True)
        stats, docs, quarantine = extract_files(str(tmp_path / "w"), [(str(p), fmt)],
                                                text_field="content" if fmt == "parquet" else "text")
        assert {q["position"]: q["reason"] for q in quarantine} == want, name
        assert stats["extract"]["records"] == len(docs) + len(quarantine), name
        n += 1
    assert n >= 600


def _split_members(data: bytes) -> list[bytes]:
    """The gzip members of a .warc.gz, as bytes (one per record)."""
    out, rest = [], data
    while rest:
        d = zlib.decompressobj(wbits=31)
        d.decompress(rest)
        out.append(rest[: len(rest) - len(d.unused_data)])
        rest = d.unused_data
    return out


# -- end to end -------------------------------------------------------------------------------
def _damaged_corpus(root):
    """Good files of every format next to damaged ones, incl. each failure named in the issue."""
    rng = random.Random(SEED + 1)
    corpus = root / "corpus"
    corpus.mkdir()
    good = base_files("good")
    for name, (data, _) in good.items():
        (corpus / f"0-{name}").write_bytes(data)
    def base(tag, ext):  # distinct documents in every damaged file, so exact dedup does not hide what was kept
        return base_files(tag)[f"{tag}.{ext}"][0]

    lines, pq_data = base("surrogate", "jsonl"), base("page", "parquet")
    warc, members = base("flipped", "warc.gz"), _split_members(base("malformed", "warc.gz"))
    meta = pq.ParquetFile(io.BytesIO(pq_data)).metadata.row_group(1).column(1)
    page = bytearray(pq_data)
    start = meta.dictionary_page_offset or meta.data_page_offset  # the column chunk: its pages, not the next row group's
    for i in range(meta.data_page_offset + 30, start + meta.total_compressed_size - 10):
        page[i] ^= 0x33
    files = {
        "1-surrogate.jsonl": lines[:2000].rsplit(b"\n", 1)[0] + b'\n{"text": "lone \\ud800 here"}\n' + lines[-3000:].split(b"\n", 1)[1],
        "1-not-zstd.jsonl.zst": base("notzstd", "jsonl"),
        "1-not-gzip.jsonl.gz": base("notgzip", "jsonl"),
        "1-cut.jsonl.gz": base("cut", "jsonl.gz")[:40_000],
        "2-corrupt.parquet": b"not parquet " * 50,
        "2-cut.parquet": base("cut", "parquet")[:-100],
        "2-zero.parquet": b"",
        "2-damaged-page.parquet": bytes(page),
        "3-malformed.warc.gz": b"".join(members[:5] + [_gz(gzip.decompress(members[5]).replace(b"WARC/1.0", b"WARX/9"))]
                                        + members[6:]),
        "3-flipped.warc.gz": (lambda b: (b.__setitem__(len(b) // 2, b[len(b) // 2] ^ 0xFF), bytes(b))[1])(bytearray(warc)),
        "4-latin1.txt": "café déjà vu, naïve façade".encode("latin-1"),
    }
    for name, data in files.items():
        (corpus / name).write_bytes(data)
    for i, (label, data) in enumerate(list(mutations("x.jsonl.zst", base("fuzz", "jsonl.zst"), rng))[::9]):
        (corpus / f"5-fuzz-{i:02d}-{label}.jsonl.zst").write_bytes(data)
    return corpus, good


def _prepare(corpus, out, **over):
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import prepare

    d = {"inputs": [str(corpus / "*.jsonl*"), {"path": str(corpus / "*.parquet"), "text_field": "content"},
                    str(corpus / "*.txt"), str(corpus / "*.warc.gz")],
         "output": {"store": str(out / "store"), "dataset": "fuzz"}, "work_dir": str(out / "work"),
         "language": {"enabled": False}, "split": {"validation_fraction": 0.0},
         "tokenizer": {"vocab_size": 300, "sample_bytes": 100_000}, "pack": {"seq_len": 32, "shard_bytes": 40_000}, **over}
    return prepare(PrepareConfig.from_dict(d), quiet=True)


def test_prepare_finishes_on_a_corpus_of_damaged_files_keeps_the_good_records_and_balances(tmp_path):
    from gristmill.manifests import load_manifest, read_doc_index

    corpus, good = _damaged_corpus(tmp_path)
    result = _prepare(corpus, tmp_path / "a")
    acc = result.report["accounting"]
    assert acc["balanced"] and acc["input"] == acc["kept"] + sum(acc["removed"].values()) + sum(acc["quarantined"].values())
    for reason in ("lone_surrogate", "corrupt_compression", "truncated", "corrupt_parquet", "malformed_warc", "invalid_utf8"):
        assert acc["quarantined"].get(reason), (reason, acc["quarantined"])
    quarantine = [json.loads(line) for line in open(os.path.join(result.run_dir, "quarantine.jsonl"))]
    by_file = {}
    for q in quarantine:
        by_file.setdefault(os.path.basename(q["source"]), []).append(q)
    assert not any(f.startswith("0-") for f in by_file)  # nothing of the good files is quarantined
    assert [q["reason"] for q in by_file["1-surrogate.jsonl"]] == ["lone_surrogate"]
    assert [q["reason"] for q in by_file["2-damaged-page.parquet"]] == ["corrupt_parquet"]
    assert by_file["2-zero.parquet"][0]["end"] == 0 and by_file["2-cut.parquet"][0]["reason"] == "truncated"
    # every good record is in the published dataset
    pub = load_manifest(result.url)
    seen = set(read_doc_index(os.path.join(result.url, pub.manifest.doc_index.path)).column("doc_id").to_pylist())
    for name, (data, fmt) in good.items():
        _, docs, _ = extract_files(str(tmp_path / "w" / name), [(str(corpus / f"0-{name}"), fmt)],
                                   text_field="content" if fmt == "parquet" else "text")
        assert {f"0-{name}:{d['position']}" for d in docs} <= seen, name
    # the records of the damaged files read before the damage are there too
    assert {"1-surrogate.jsonl:0", "1-cut.jsonl.gz:0", "2-damaged-page.parquet:0", "2-damaged-page.parquet:199",
            "3-malformed.warc.gz:0", "3-flipped.warc.gz:0"} <= seen
    # and damaged inputs do not make the output depend on the partitioning
    other = _prepare(corpus, tmp_path / "b", partitioning={"partition_bytes": 1})
    assert other.report["accounting"] == acc and other.manifest_sha256 == result.manifest_sha256
