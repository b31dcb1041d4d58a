"""Input readers: one fsspec file in, a stream of records out, nothing lost silently.

A reader yields one dict per input record, in file order. A good record has ``text`` (and,
where the format has one, ``user_id`` and ``url``); a bad one has ``reason`` and ``detail``
instead, and goes to quarantine. Every record carries ``position``: its record index (JSONL,
Parquet, text) or the byte offset of the record in the uncompressed stream (WARC), and where
bytes mean something an ``offset`` (and for a bad one an ``end``, exclusive, None if unknown):
its byte range in the uncompressed stream of the file (a Parquet row group's: in the file).

Whatever a file holds, a reader does not raise on its content: a damaged part ends the file
with ONE record for the unreadable rest (``truncated``, ``corrupt_compression``,
``corrupt_parquet``, ``malformed_warc``), after every record read before the damage. A damaged
Parquet row group is one record and the row groups after it are read (they are independent).

Reading is streaming: memory does not grow with the file size.
"""
from __future__ import annotations

import io
import json
import re
import zlib
from typing import Iterator, NamedTuple

from gristmill.manifests.storage import Store, sized_readline

RAW_SNIPPET = 500  # bytes of a bad record kept in quarantine, enough to find and fix it
PIECE = 1 << 14  # compressed bytes read from a file at a time: what a damaged stream loses at most before the damage
ZSTD_PIECE = 128  # compressed bytes fed to the zstd decoder per call: bounds its output (~4 MiB) whatever the ratio
OUT_CHUNK = 1 << 20  # decoded bytes per gzip decoder call (zlib max_length)
# The default of extract.max_record_bytes: bytes of one record in the uncompressed stream (a JSONL
# line, a text file, a WARC record's block, a Parquet text value) above which it is quarantined
# as `record_too_large` without being held in memory whole.
MAX_RECORD_BYTES = 64 << 20
MAX_PARQUET_ROWS = 1 << 48  # a footer claiming more rows than this is not believed
# The quarantine reason of an input file that resolves, through a symlink, outside the folder its
# pattern matched under (``Store.escapes``): refused unread, for a downloaded corpus may link to ~/.ssh.
SYMLINK_OUTSIDE_ROOT = "symlink_outside_root"


def bad(position: int, reason: str, detail: str, raw: bytes | str = b"", *, offset: int | None = None,
        end: int | None = None) -> dict:
    """A quarantine record. ``offset``/``end``: its byte range (see the module docstring); None where unknown."""
    if isinstance(raw, bytes):
        raw = raw[:RAW_SNIPPET].decode("utf-8", errors="backslashreplace")
    return {"position": position, "reason": reason, "detail": detail, "raw": raw[:RAW_SNIPPET], "offset": offset, "end": end}


class DamagedStream(OSError):
    """A compressed stream that cannot be decoded past some point.

    ``reason`` is ``truncated`` (the input ended inside a gzip member or zstd frame, an empty
    file included) or ``corrupt_compression`` (bytes that are not, or no longer, valid gzip/zstd);
    ``offset`` is how many uncompressed bytes were decoded before it, ``consumed`` how many
    compressed bytes were fed to the decoder without error. An OSError, so that code catching
    I/O errors of a file (FastWARC's stream wrapper below) catches it too.
    """

    def __init__(self, reason: str, message: str, offset: int, consumed: int):
        super().__init__(f"{message} (after {offset:,} uncompressed bytes; compressed input read without error: "
                         f"{consumed:,} bytes)")
        self.reason, self.offset, self.consumed = reason, offset, consumed


class _Decompressed(io.RawIOBase):
    """A gzip or zstd stream (member after member, frame after frame) that fails loudly.

    Python's gzip and zstandard's stream_reader lose what they decoded in a read that fails, and
    zstandard returns a short stream silently on truncated input; both would drop records
    without a trace. Here the input is fed in small pieces, so everything decoded before
    the damaged piece is handed out first, and the end of input is checked against the
    decoder's end-of-frame state. Concatenated members/frames are read like one stream; zero
    bytes between gzip members (tape padding) are skipped, as gzip(1) does.

    Memory is bounded whatever the compression ratio: gzip output comes ``OUT_CHUNK`` bytes at
    a time (``max_length``); zstd input is fed ``ZSTD_PIECE`` bytes at a time (a zstd block of a
    few bytes can stand for 128 KiB, so one call makes at most ~4 MiB). Decoded bytes are handed
    out from an offset into the current chunk, never by re-slicing it: a high-ratio input once
    cost a copy of the whole decoded chunk per read (zstd at ~3 MB/s).
    """

    def __init__(self, raw, kind: str):
        self._raw, self._kind = raw, kind
        self._d, self._buf, self._pos, self._in = None, b"", 0, b""
        self._pending = False  # gzip: the last call filled its max_length, so zlib may hold more output
        self.produced = self.consumed = 0

    def _decoder(self):
        if self._kind == "gz":
            return zlib.decompressobj(wbits=31)  # the gzip wrapper: header, CRC32 and length are checked
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()

    def readable(self) -> bool:
        return True

    def _fail(self, reason: str, message: str):
        raise DamagedStream(reason, message, self.produced, self.consumed)

    def _fill(self) -> None:
        """Decode until there is output or the input has ended cleanly."""
        import zstandard

        while self._pos >= len(self._buf):
            if not self._in and not self._pending:
                self._in = self._raw.read(PIECE)
                if not self._in:
                    if self._d is None and self.consumed:
                        return  # ended after a complete member/frame
                    name = "gzip member" if self._kind == "gz" else "zstd frame"
                    self._fail("truncated", f"the file is empty: not even one {name}" if not self.consumed else
                               f"input ended inside a {name} (truncated file)")
            if self._d is None:  # a new member/frame starts here
                if self._kind == "gz" and self.consumed and not self._in.strip(b"\0"):
                    self.consumed += len(self._in)
                    self._in = b""
                    continue
                self._d = self._decoder()
            try:
                if self._kind == "gz":
                    piece = self._in
                    out = self._d.decompress(piece, OUT_CHUNK)
                    self._in, self._pending = self._d.unconsumed_tail, len(out) == OUT_CHUNK
                else:
                    piece, self._in = self._in[:ZSTD_PIECE], self._in[ZSTD_PIECE:]
                    out = self._d.decompress(piece)
            except (zlib.error, zstandard.ZstdError) as e:
                self._fail("corrupt_compression", f"not valid {'gzip' if self._kind == 'gz' else 'zstd'} data: {e}")
            used = len(piece) - len(self._in) if self._kind == "gz" else len(piece)
            if self._d.eof:
                rest = self._d.unused_data
                self._in = rest + self._in if self._kind == "zst" else rest
                used -= len(rest)
                self._d, self._pending = None, False
            self.consumed += used
            self._buf, self._pos = out, 0

    # FastWARC tells and seeks (forward, past a record): by reading on, in the uncompressed stream.
    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.produced

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset if whence == 0 else self.produced + offset if whence == 1 else -1
        if target < self.produced:
            raise io.UnsupportedOperation(f"a compressed stream seeks forward only (to {offset}, whence {whence})")
        while self.produced < target and self.readinto(memoryview(bytearray(min(target - self.produced, 1 << 20)))):
            pass
        return self.produced

    def readinto(self, b) -> int:
        self._fill()
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos:self._pos + n]
        self._pos += n
        self.produced += n
        return n


def special_file(p: str) -> str:
    """What a path that is not a regular file is, in words (a FIFO never ends or never starts,
    a device such as /dev/zero never ends): for the one-line refusals of input and eval files."""
    import os
    import stat

    try:
        mode = os.stat(p).st_mode
    except OSError:
        return "not a regular file"
    return next((what for test, what in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                                         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                                         (stat.S_ISDIR, "a directory")) if test(mode)),
                "a special file")


def longer_than(text: str, limit: int) -> bool:
    """Whether ``text`` takes more than ``limit`` bytes in UTF-8: encoded only when it could (a
    character is at most 4 bytes), so a short text costs a length, not an encode."""
    return len(text) > limit // 4 and len(text.encode("utf-8", "surrogatepass")) > limit


COMPRESSIONS = (".gz", ".zst")  # what open_stream decodes (by the name's suffix)


def open_file(uri: str, store: Store | None = None):
    """``uri`` opened for reading through ``store`` (the one its owner opened with the input's or
    eval set's storage options); None: the URL's store, with no options."""
    store = store or Store.from_url(uri)
    return store.fs.open(store.path(uri), "rb")


def open_stream(f, uri: str):
    """Decompress by extension (.gz, .zst); other files are read as they are."""
    for ext, kind in ((".gz", "gz"), (".zst", "zst")):
        if uri.endswith(ext):
            return io.BufferedReader(_Decompressed(f, kind), buffer_size=1 << 20)
    return sized_readline(f, buffer_size=1 << 20)  # bounded_lines reads lines by size, from any store


def _damage(position: int, e: OSError, offset: int | None, what: str, raw: bytes = b"") -> dict:
    """The one quarantine record that stands for the unreadable rest of a file: a DamagedStream,
    or (``read_error``) any other I/O error the file raised while it was read."""
    return bad(position, getattr(e, "reason", "read_error"), f"{what}: {type(e).__name__}: {e}", raw, offset=offset)


def _too_large(position: int, offset: int | None, size: int | None, limit: int, what: str, raw: bytes) -> dict:
    """A record past ``max_record_bytes``: quarantined (its first bytes kept), never held whole."""
    n = f"{size:,} bytes" if size is not None else "more bytes"
    return bad(position, "record_too_large", f"{what} holds {n}, over extract.max_record_bytes ({limit:,}); raise the "
               "limit to read it", raw, offset=offset, end=offset + size if size is not None and offset is not None else None)


LINE_PIECE = 1 << 20  # bytes of a line read at a time: a line over the limit is never joined whole


def bounded_lines(stream, limit: int, read_past: bool = True) -> Iterator[tuple[bytes | None, int, bytes]]:
    """The lines of a byte stream as (line, length, first bytes); a line longer than ``limit``
    bytes (its newline included) comes as (None, its length, its first bytes), read past in
    pieces: memory stays O(limit) however long the line (one 4 GiB line in a 4 MB gzip).
    Without ``read_past`` (a reader for which such a line ends the file) it comes as soon as
    the limit is passed, its length the bytes read so far, and the lines end there.

    A line is read ``LINE_PIECE`` bytes at a time and joined only when it fits: one
    ``readline(limit + 1)`` would hold the pieces and their join at once (2 x 64 MiB)."""
    while True:
        want = min(LINE_PIECE, limit + 1)
        line = stream.readline(want)
        if not line:
            return
        pieces, n = [line], len(line)
        while n <= limit and len(line) == want and not line.endswith(b"\n"):  # a full piece: the line goes on
            want = min(LINE_PIECE, limit + 1 - n)
            line = stream.readline(want)
            if not line:
                break
            pieces.append(line)
            n += len(line)
        if n <= limit:
            line = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            del pieces  # not held beside the joined line while the caller parses it
            yield line, n, b""
            continue
        head = pieces[0][:RAW_SNIPPET]
        del pieces
        if not read_past:
            yield None, n, head
            return
        while not line.endswith(b"\n"):
            line = stream.readline(LINE_PIECE)
            if not line:
                break
            n += len(line)
        yield None, n, head


def read_jsonl(uri: str, text_field: str, id_field: str | None, url_field: str | None = None,
               max_record_bytes: int = MAX_RECORD_BYTES, store: Store | None = None) -> Iterator[dict]:
    """One JSON object per line; blank lines are not records and are skipped. A line over
    ``max_record_bytes`` (uncompressed, newline included) is quarantined as ``record_too_large``."""
    index = offset = 0
    with open_file(uri, store) as f:
        stream = open_stream(f, uri)
        try:
            for line, n, head in bounded_lines(stream, max_record_bytes):
                if line is None:
                    yield _too_large(index, offset, n, max_record_bytes, f"line {index + 1:,}", head)
                    index += 1
                elif line.strip():
                    yield _jsonl_record(index, offset, line, text_field, id_field, url_field)
                    index += 1
                offset += n
        except DamagedStream as e:
            yield _damage(index, e, offset, f"records from {index} (byte {offset:,}) on are unreadable")


class BadJson(NamedTuple):
    """Why a line is not a JSON object: a quarantine reason and its detail."""

    reason: str
    detail: str


def json_object(s: str) -> dict | BadJson:
    """One JSON line as an object, or why it is not one (the one JSON-line parser of input and
    eval files): ``malformed_json`` (not JSON, nested deeper than the parser's recursion limit,
    not an object) or ``number_too_large`` (an integer of more digits than Python converts,
    ``sys.get_int_max_str_digits()``: 4300 by default; a 5,000-digit id once ended the job)."""
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        return BadJson("malformed_json", f"not valid JSON: {e}")
    except RecursionError:  # [[[[...]]]] nested deeper than the JSON parser's recursion limit
        return BadJson("malformed_json", "nested too deeply to parse")
    except ValueError as e:  # int('9' * 5000): "Exceeds the limit (4300 digits) for integer string conversion"
        return BadJson("number_too_large", f"a number too long to read: {str(e).split(';')[0]}")
    if not isinstance(obj, dict):
        return BadJson("malformed_json", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def text_problem(value, what: str) -> tuple[str, str]:
    """The reason and detail for a text value that is not a string: null or absent
    (``missing_text_field``), or another type, e.g. a number, list or struct (``text_not_a_string``)."""
    if value is None:
        return "missing_text_field", f"{what} is missing or null"
    return "text_not_a_string", f"{what} is not a string ({type(value).__name__})"


def _jsonl_record(index: int, offset: int, line: bytes, text_field: str, id_field: str | None,
                  url_field: str | None = None) -> dict:
    def no(reason: str, detail: str) -> dict:
        return bad(index, reason, detail, line, offset=offset, end=offset + len(line))

    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return no("invalid_utf8", str(e))
    obj = json_object(s)
    if isinstance(obj, BadJson):
        return no(obj.reason, obj.detail)
    text = obj.get(text_field)
    if not isinstance(text, str):
        return no(*text_problem(text, f"field {text_field!r}"))
    rec = {"position": index, "offset": offset, "text": text}
    if id_field is not None:
        if obj.get(id_field) is None:
            return no("missing_id_field", f"field {id_field!r} is missing")
        rec["user_id"] = str(obj[id_field])
    if url_field is not None and obj.get(url_field) is not None:
        rec["url"] = str(obj[url_field])
    return rec


def read_parquet(uri: str, text_field: str, id_field: str | None, batch_rows: int = 1024,
                 url_field: str | None = None, max_record_bytes: int = MAX_RECORD_BYTES,
                 store: Store | None = None) -> Iterator[dict]:
    """Row groups in order, streamed in batches. A file whose footer cannot be read is one
    quarantine record (nothing of it is readable); a row group that fails to decode is one
    record for its unread rows (position = the first of them, offset/end = the row group's
    bytes), and the row groups after it are read: they are independent of it.

    The footer's row counts are claims: a row group that holds fewer rows than it claims gets
    one ``corrupt_parquet`` record for the missing ones; a footer whose counts cannot be true
    (negative, not adding up, or beyond 2^48 rows) makes the whole file one; a missing text
    column is one record per row group, never a loop over claimed rows. A text value over
    ``max_record_bytes`` (UTF-8) is ``record_too_large``. (pyarrow decodes a page whole: the
    limit applies to the values, not to the page buffers.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_file(uri, store) as f:
        try:
            pf = pq.ParquetFile(f)
            meta, names = pf.metadata, pf.schema_arrow.names
            groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            if any(n < 0 for n in groups) or sum(groups) != meta.num_rows or meta.num_rows > MAX_PARQUET_ROWS:
                raise ValueError(f"the footer's row counts cannot be true: {meta.num_rows:,} rows in all, row groups of "
                                 f"{', '.join(format(n, ',') for n in groups[:5])}{', ...' if len(groups) > 5 else ''}")
        except (pa.ArrowException, OSError, ValueError) as e:
            yield _unopenable_parquet(f, e)
            return
        cols = [text_field] + ([id_field] if id_field and id_field in names else [])
        url_col = url_field if url_field and url_field in names else None
        cols += [url_col] if url_col and url_col not in cols else []  # the id or text column may be the url too
        index = 0
        for g, rows in enumerate(groups):
            first = index
            if text_field not in names:  # one record per row group: a count in the footer is only a claim
                if rows:
                    lo, hi = _row_group_bytes(meta.row_group(g))
                    yield bad(first, "missing_text_field", f"column {text_field!r} not in {names}: row group {g} (rows "
                              f"{first}-{first + rows - 1}) has no text", offset=lo, end=hi)
                index += rows
                continue
            try:
                for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=cols):
                    texts = batch.column(0).to_pylist()
                    ids = batch.column(1).to_pylist() if id_field and id_field in names else [None] * len(texts)
                    urls = batch.column(cols.index(url_col)).to_pylist() if url_col else [None] * len(texts)
                    for text, uid, url in zip(texts, ids, urls):
                        if index >= first + rows:  # more rows than the footer claims
                            raise ValueError(f"row group {g} holds more rows than its footer's {rows:,}")
                        if not isinstance(text, str):
                            yield bad(index, *text_problem(text, f"column {text_field!r}"))
                        elif longer_than(text, max_record_bytes):
                            yield _too_large(index, None, len(text.encode("utf-8", "surrogatepass")), max_record_bytes,
                                             f"row {index:,} of column {text_field!r}", text[:RAW_SNIPPET].encode("utf-8", "backslashreplace"))
                        elif id_field is not None and uid is None:
                            yield bad(index, "missing_id_field", f"column {id_field!r} is missing or null")
                        else:
                            yield {"position": index, "text": text, **({"user_id": str(uid)} if id_field else {}),
                                   **({"url": str(url)} if url is not None else {})}
                        index += 1
            except (pa.ArrowException, OSError, ValueError) as e:  # ValueError: also invalid UTF-8 in a string column
                lo, hi = _row_group_bytes(meta.row_group(g))
                yield bad(index, "corrupt_parquet", f"row group {g} (rows {first}-{first + rows - 1}) is damaged: rows "
                          f"{index}-{first + rows - 1} unreadable: {type(e).__name__}: {e}", offset=lo, end=hi)
            else:
                if index < first + rows:
                    lo, hi = _row_group_bytes(meta.row_group(g))
                    yield bad(index, "corrupt_parquet", f"row group {g} holds {index - first:,} rows, not the {rows:,} its "
                              f"footer claims: rows {index}-{first + rows - 1} do not exist", offset=lo, end=hi)
            index = first + rows  # the footer's row count: positions of later row groups stay row numbers


def _unopenable_parquet(f, e: Exception) -> dict:
    """One record for a file without a readable footer; ``truncated`` when it starts like Parquet
    (or is empty) but does not end like it, i.e. it was cut short."""
    f.seek(0)
    head = f.read(4)
    size = f.seek(0, 2)
    f.seek(max(size - 4, 0))
    tail = f.read(4)
    cut = size == 0 or (head == b"PAR1" and tail != b"PAR1")
    what = "empty (0 bytes)" if size == 0 else "cut short (no footer)" if cut else "not a readable Parquet file"
    return bad(0, "truncated" if cut else "corrupt_parquet", f"the whole file ({size:,} bytes) is {what}: {type(e).__name__}: {e}",
               head, offset=0, end=size)


def _row_group_bytes(rg) -> tuple[int | None, int | None]:
    """The byte range of a row group's column chunks in the file (from the footer)."""
    try:
        starts, ends = [], []
        for c in range(rg.num_columns):
            col = rg.column(c)
            start = col.dictionary_page_offset if col.has_dictionary_page and col.dictionary_page_offset else col.data_page_offset
            starts.append(start)
            ends.append(start + col.total_compressed_size)
        return (min(starts), max(ends)) if starts else (None, None)
    except (OSError, ValueError, TypeError):
        return None, None


def read_text(uri: str, max_record_bytes: int = MAX_RECORD_BYTES, store: Store | None = None) -> Iterator[dict]:
    """A plain text file is one document (position 0): all of it, or quarantined whole (over
    ``max_record_bytes`` uncompressed: ``record_too_large``, read no further)."""
    with open_file(uri, store) as f:
        try:
            data = open_stream(f, uri).read(max_record_bytes + 1)
        except DamagedStream as e:
            yield _damage(0, e, 0, "the document cannot be read whole")
            return
    if len(data) > max_record_bytes:
        yield _too_large(0, 0, None, max_record_bytes, "the text file", data[:RAW_SNIPPET])
        return
    try:
        yield {"position": 0, "offset": 0, "text": data.decode("utf-8")}
    except UnicodeDecodeError as e:
        yield bad(0, "invalid_utf8", str(e), data[max(e.start - 100, 0):], offset=0, end=len(data))


class _StopAtCorruption:
    """Ends the stream quietly where decompression fails, and remembers why.

    FastWARC reads ahead in large chunks; if the error reached it, the records before the
    cut would be lost with it. This way they are read, and the caller reports the cut.
    (FastWARC also seeks and tells, which the gzip/zstd streams support going forward.) Also
    how the WARC reader re-reads a damaged stream up to the damage (``_warc_record_end``).
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
            except OSError as e:
                self.error = e
                break
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def seek(self, offset: int, whence: int = 0) -> int:
        try:
            return self._s.seek(offset, whence)
        except OSError as e:
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


def read_warc(uri: str, main_content: bool = True, max_record_bytes: int = MAX_RECORD_BYTES,
              store: Store | None = None) -> Iterator[dict]:
    """HTTP responses of a WARC file, HTML converted to text with resiliparse.

    The stream is decompressed in Python (not by FastWARC) so a damaged .warc.gz is noticed.
    Every record (of any type) is checked to be whole: the first one that is not, or a
    malformed record header, ends the file with one quarantine record for the rest of it
    (``truncated``, ``corrupt_compression`` or ``malformed_warc``); the records before it are
    read normally. ``position`` is the byte offset in the uncompressed WARC. A record whose
    Content-Length is over ``max_record_bytes`` is ``record_too_large`` and skipped unread (in
    pieces); one beyond 2^62 bytes (no offset after it is representable) also ends the file.
    """
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    with open_file(uri, store) as f:
        raw_stream = open_stream(f, uri)
        # The end of a rest that is not compressed is the end of the file; of a compressed one, unknown.
        size = f.size if raw_stream is f and isinstance(getattr(f, "size", None), int) else None
        stream = _StopAtCorruption(raw_stream)
        last = None  # the offset of the last whole record
        try:
            for record in ArchiveIterator(stream, parse_http=True, stream_detect=False, fsspec_args=False):
                position, response = record.stream_pos, record.record_type == WarcRecordType.response
                length = record.headers.get("Content-Length")
                if length is not None and not length.strip().isdigit():
                    yield bad(position, "malformed_warc", f"the WARC record at byte {position:,} has Content-Length {length!r}; "
                              "the rest of the file is not read", _bytes_at(uri, position, store), offset=position, end=size)
                    return
                if length is not None and int(length) > max_record_bytes:  # never read into memory
                    declared, head = int(length), record.reader.read(RAW_SNIPPET)
                    if declared >= _WARC_LENGTH_MAX:  # FastWARC's own count has overflowed: nothing after it is findable
                        yield bad(position, "record_too_large", f"the WARC record at byte {position:,} declares Content-Length "
                                  f"{declared:,}, past any real file; the rest of the file is not read", _bytes_at(uri, position, store),
                                  offset=position, end=size)
                        return
                    yield _too_large(position, position, declared, max_record_bytes, f"the WARC record at byte {position:,}", head)
                    continue  # FastWARC reads past its block in pieces
                body = record.reader.read() if response else b""
                # A header cut before its Content-Length, or a block shorter than it: the file ends in this record.
                if length is None or len(body) + record.consume() != record.content_length:
                    if stream.error is not None:
                        yield _damage(position, stream.error, position, f"the WARC record at byte {position:,} and the rest")
                    else:
                        yield bad(position, "truncated", f"the WARC record at byte {position:,} ends early: the file was cut",
                                  body, offset=position, end=size)
                    return
                last = position
                if response:
                    yield _warc_record(record, body, main_content)
        except OSError as e:  # FastWARC: a record header it cannot parse
            if stream.error is None:
                where, raw = _warc_record_end(uri, last, store)
                yield bad(where if where is not None else (last + 1 if last is not None else 0), "malformed_warc",
                          f"{e} in the record after {'byte ' + format(last, ',') if last is not None else 'the start of the file'}; "
                          "the rest of the file is not read", raw, offset=where, end=size if where is not None else None)
                return
        if stream.error is not None:  # decompression stopped between two records
            offset = _warc_record_end(uri, last, store)[0]
            where = offset if offset is not None else getattr(stream.error, "offset", (last or 0) + 1)
            yield _damage(where, stream.error, offset, "the rest of the WARC after the last whole record")


_WARC_HEAD_MAX = 1 << 16
_WARC_LENGTH_MAX = 1 << 62  # a Content-Length at or past this is no real record (offsets are int64)


def _warc_record_end(uri: str, start: int | None, store: Store | None = None) -> tuple[int | None, bytes]:
    """Where the record after the one at byte ``start`` begins (0 with no ``start``), and its first bytes.

    FastWARC does not say where a header it rejects starts; this re-reads the (uncompressed)
    stream from the last good record: its header block, its Content-Length bytes and the blank
    line after them. Done once per malformed file. (None, b"") if it cannot tell.
    """
    with open_file(uri, store) as f:
        s, end, rest = _StopAtCorruption(open_stream(f, uri)), 0, b""  # reads up to damage, never past or into an error
        if start is not None:
            _skip(s, start)
            head = s.read(_WARC_HEAD_MAX)
            cut = head.find(b"\r\n\r\n")
            m = re.search(rb"(?im)^content-length:[ \t]*(\d+)", head[:cut]) if cut >= 0 else None
            if m is None or int(m.group(1)) >= _WARC_LENGTH_MAX:
                return None, b""
            end = start + cut + 4 + int(m.group(1))
            rest = head[end - start:]
            _skip(s, end - start - len(head))  # nothing to skip when the block ends inside `head`
        rest += s.read(RAW_SNIPPET + 8)
    gap = len(rest) - len(rest.lstrip(b"\r\n"))
    return end + gap, rest[gap:]


def _bytes_at(uri: str, offset: int, store: Store | None = None) -> bytes:
    """The first bytes at ``offset`` of the uncompressed stream (for a quarantine record's ``raw``)."""
    with open_file(uri, store) as f:
        s = _StopAtCorruption(open_stream(f, uri))
        _skip(s, offset)
        return s.read(RAW_SNIPPET)


def _skip(s, n: int) -> None:
    while n > 0:
        chunk = s.read(min(n, 1 << 20))
        if not chunk:
            return
        n -= len(chunk)


def _warc_record(record, body: bytes, main_content: bool) -> dict:
    from .html import HtmlError, html_to_text

    position = record.stream_pos
    url = record.headers.get("WARC-Target-URI", "")
    ctype = (record.http_content_type or "").lower()
    if ctype and "html" not in ctype and not ctype.startswith("text/"):
        return bad(position, "not_html", f"HTTP content type {ctype!r} of {url}", body[:200], offset=position)
    try:
        text = html_to_text(body, record.http_charset, main_content)
    except HtmlError as e:
        return bad(position, e.reason, f"{url}: {e}", body, offset=position)
    return {"position": position, "offset": position, "text": text, "url": url}


def _html_records(recs: Iterator[dict], main_content: bool) -> Iterator[dict]:
    from .html import HtmlError, html_str_to_text

    for rec in recs:
        if "reason" not in rec:
            try:
                rec["text"] = html_str_to_text(rec["text"], main_content)
            except HtmlError as e:
                rec = bad(rec["position"], e.reason, f"{rec.get('url') or 'the record'}: {e}", rec["text"][:RAW_SNIPPET].encode("utf-8", "backslashreplace"), offset=rec.get("offset"))
        yield rec


def read_records(uri: str, fmt: str, text_field: str = "text", id_field: str | None = None, *,
                 main_content: bool = True, batch_rows: int = 1024, html: bool = False,
                 url_field: str | None = None, max_record_bytes: int = MAX_RECORD_BYTES,
                 store: Store | None = None) -> Iterator[dict]:
    """The records of one input file (read through ``store``: its input's, with the entry's
    storage options; None: the URL's, with none). ``html``: jsonl/parquet ``text_field`` holds HTML, turned
    into text by the extractor WARC pages go through (same settings); a page it cannot read is
    quarantined with the WARC reasons (``invalid_html``). ``max_record_bytes``: see
    ``MAX_RECORD_BYTES`` (extract.max_record_bytes)."""
    if fmt in ("jsonl", "parquet"):
        recs = read_jsonl(uri, text_field, id_field, url_field, max_record_bytes, store) if fmt == "jsonl" \
            else read_parquet(uri, text_field, id_field, batch_rows, url_field, max_record_bytes, store)
        return _html_records(recs, main_content) if html else recs
    if fmt == "text":
        return read_text(uri, max_record_bytes, store)
    if fmt == "warc":
        return read_warc(uri, main_content, max_record_bytes, store)
    raise ValueError(f"unknown input format {fmt!r}")
