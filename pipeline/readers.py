"""Input readers: one fsspec file in, a stream of records out, nothing lost silently.

A reader yields one dict per input record, in file order. A good record has ``text`` (and,
where the format has one, ``user_id`` and ``url``); a bad one has ``reason`` and ``detail``
instead, and goes to quarantine. Every record carries ``position``: its record index (JSONL,
Parquet, text) or the byte offset of the record in the uncompressed stream (WARC). A file that
ends early (a truncated .gz/.zst) yields what it could read and then one ``truncated`` record.

Reading is streaming: memory does not grow with the file size.
"""
from __future__ import annotations

import gzip
import io
import json
from typing import Iterator

import fsspec

RAW_SNIPPET = 500  # bytes of a bad record kept in quarantine, enough to find and fix it


def bad(position: int, reason: str, detail: str, raw: bytes | str = b"") -> dict:
    if isinstance(raw, bytes):
        raw = raw[:RAW_SNIPPET].decode("utf-8", errors="backslashreplace")
    return {"position": position, "reason": reason, "detail": detail, "raw": raw[:RAW_SNIPPET]}


class _ZstdRaw(io.RawIOBase):
    """A zstd stream that raises EOFError when the input ends mid-frame.

    ``zstandard``'s stream_reader returns a short stream silently on truncated input, which
    would lose records without a trace; a decompressobj exposes ``eof`` so we can tell.
    """

    def __init__(self, raw):
        import zstandard

        self._raw, self._zstd = raw, zstandard.ZstdDecompressor()
        self._d, self._buf = self._zstd.decompressobj(), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            chunk = self._raw.read(1 << 20)
            if not chunk:
                if not self._d.eof:
                    raise EOFError("zstd stream ended before the end-of-frame marker (truncated file)")
                return 0
            if self._d.eof:  # a new frame follows a finished one
                self._d = self._zstd.decompressobj()
            self._buf = self._d.decompress(chunk)
            while self._d.eof and self._d.unused_data:
                rest = self._d.unused_data
                self._d = self._zstd.decompressobj()
                self._buf += self._d.decompress(rest)
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        return n


def open_stream(f, uri: str):
    """Decompress by extension (.gz, .zst); other files are read as they are."""
    if uri.endswith(".gz"):
        return gzip.GzipFile(fileobj=f, mode="rb")
    if uri.endswith(".zst"):
        return io.BufferedReader(_ZstdRaw(f), buffer_size=1 << 20)
    return f


def _truncated(position: int, e: Exception) -> dict:
    return bad(position, "truncated", f"file ended early after {position} records: {e}")


def read_jsonl(uri: str, text_field: str, id_field: str | None) -> Iterator[dict]:
    """One JSON object per line; blank lines are not records and are skipped."""
    index = 0
    with fsspec.open(uri, "rb") as f:
        stream = open_stream(f, uri)
        try:
            for line in stream:
                if not line.strip():
                    continue
                yield _jsonl_record(index, line, text_field, id_field)
                index += 1
        except (EOFError, OSError) as e:  # truncated or corrupt compressed stream
            yield _truncated(index, e)


def _jsonl_record(index: int, line: bytes, text_field: str, id_field: str | None) -> dict:
    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return bad(index, "invalid_utf8", str(e), line)
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        return bad(index, "malformed_json", str(e), line)
    if not isinstance(obj, dict):
        return bad(index, "malformed_json", f"expected a JSON object, got {type(obj).__name__}", line)
    text = obj.get(text_field)
    if not isinstance(text, str):
        what = "missing" if text is None else f"not a string ({type(text).__name__})"
        return bad(index, "missing_text_field", f"field {text_field!r} is {what}", line)
    rec = {"position": index, "text": text}
    if id_field is not None:
        if obj.get(id_field) is None:
            return bad(index, "missing_id_field", f"field {id_field!r} is missing", line)
        rec["user_id"] = str(obj[id_field])
    return rec


def read_parquet(uri: str, text_field: str, id_field: str | None, batch_rows: int = 1024) -> Iterator[dict]:
    import pyarrow.parquet as pq

    with fsspec.open(uri, "rb") as f:
        pf = pq.ParquetFile(f)
        names = pf.schema_arrow.names
        if text_field not in names:
            for i in range(pf.metadata.num_rows):  # every row is a record without text: account for each
                yield bad(i, "missing_text_field", f"column {text_field!r} not in {names}")
            return
        cols = [text_field] + ([id_field] if id_field and id_field in names else [])
        index = 0
        for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
            texts = batch.column(0).to_pylist()
            ids = batch.column(1).to_pylist() if len(cols) > 1 else [None] * len(texts)
            for text, uid in zip(texts, ids):
                if not isinstance(text, str):
                    yield bad(index, "missing_text_field", f"column {text_field!r} is null or not a string")
                elif id_field is not None and uid is None:
                    yield bad(index, "missing_id_field", f"column {id_field!r} is missing or null")
                else:
                    yield {"position": index, "text": text, **({"user_id": str(uid)} if id_field else {})}
                index += 1


def read_text(uri: str) -> Iterator[dict]:
    """A plain text file is one document (position 0)."""
    with fsspec.open(uri, "rb") as f:
        try:
            data = open_stream(f, uri).read()
        except (EOFError, OSError) as e:
            yield _truncated(0, e)
            return
    try:
        yield {"position": 0, "text": data.decode("utf-8")}
    except UnicodeDecodeError as e:
        yield bad(0, "invalid_utf8", str(e), data)


class _StopAtCorruption:
    """Ends the stream quietly where decompression fails, and remembers why.

    FastWARC reads ahead in large chunks; if the error reached it, the records before the
    cut would be lost with it. This way they are read, and the caller reports the cut.
    (FastWARC also seeks and tells, which the gzip/zstd streams support going forward.)
    """

    def __init__(self, stream):
        self._s, self.error = stream, None
        self._read1 = getattr(stream, "read1", stream.read)

    def read(self, n: int = -1) -> bytes:
        # Small read1 steps: a failing read() would discard what it decompressed before the cut.
        out = bytearray()
        while self.error is None and (n < 0 or len(out) < n):
            try:
                chunk = self._read1(65536 if n < 0 else min(65536, n - len(out)))
            except (EOFError, OSError) as e:
                self.error = e
                break
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def seek(self, offset: int, whence: int = 0) -> int:
        try:
            return self._s.seek(offset, whence)
        except (EOFError, OSError) as e:
            self.error = self.error or e
            return self._s.tell()

    def tell(self) -> int:
        return self._s.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        pass


def read_warc(uri: str, main_content: bool = True) -> Iterator[dict]:
    """HTTP responses of a WARC file, HTML converted to text with resiliparse.

    The stream is decompressed in Python (not by FastWARC) so a truncated .warc.gz is noticed;
    the record that the cut went through is quarantined as ``truncated`` (with the records
    before it read normally). ``position`` is the byte offset in the uncompressed WARC.
    """
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    with fsspec.open(uri, "rb") as f:
        stream = _StopAtCorruption(open_stream(f, uri))
        pending = None  # hold one record back: if the file was cut, the last one is incomplete
        for record in ArchiveIterator(stream, record_types=WarcRecordType.response,
                                      parse_http=True, stream_detect=False, fsspec_args=False):
            if pending is not None:
                yield pending
            pending = _warc_record(record, main_content)
        if stream.error is not None:
            where = pending["position"] if pending is not None else 0
            yield bad(where, "truncated", f"WARC stream ended early in the record at byte {where}: {stream.error}")
        elif pending is not None:
            yield pending


def _warc_record(record, main_content: bool) -> dict:
    from .html import html_to_text

    position = record.stream_pos
    url = record.headers.get("WARC-Target-URI", "")
    body = record.reader.read()
    ctype = (record.http_content_type or "").lower()
    if ctype and "html" not in ctype and not ctype.startswith("text/"):
        return bad(position, "not_html", f"HTTP content type {ctype!r} of {url}", body[:200])
    text, err = html_to_text(body, record.http_charset, main_content)
    if err:
        return bad(position, "invalid_html", f"{url}: {err}", body)
    return {"position": position, "text": text, "url": url}


def read_records(uri: str, fmt: str, text_field: str = "text", id_field: str | None = None, *,
                 main_content: bool = True, batch_rows: int = 1024) -> Iterator[dict]:
    if fmt == "jsonl":
        return read_jsonl(uri, text_field, id_field)
    if fmt == "parquet":
        return read_parquet(uri, text_field, id_field, batch_rows)
    if fmt == "text":
        return read_text(uri)
    if fmt == "warc":
        return read_warc(uri, main_content)
    raise ValueError(f"unknown input format {fmt!r}")
