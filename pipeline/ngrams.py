"""Normalised word n-gram hashing and the eval n-gram index. Plain Python + numpy, no Ray.

The decontamination stage runs this on Ray workers; the audit runs the same code on arbitrary
texts to check a leak, so "contains eval item X" means the same thing in both places.

Words are those of ``pipeline.text.words``: NFKC, case-folded, split on punctuation and
space. Word hashes come from ``pipeline.wordhash`` (shared with MinHash): a polynomial hash of
the word's code points mod 2**64, finished with its 64-bit mixer ``mix64`` (MurmurHash3
fmix64). An n-gram is hashed from its word hashes the same way. All of it is
fixed integer arithmetic on numpy uint64 (wrapping), so the hashes are stable across
processes, machines and runs (never Python's salted ``hash()``), and a whole batch of
documents is hashed in a few vectorised passes instead of a Python loop per n-gram.

An eval item with at least ``n`` words contributes its distinct n-grams; a shorter one
contributes itself, whole, as one gram of its own length. A document "contains" item X with
``hits`` = the number of its gram positions whose hash is one of X's grams.
"""
from __future__ import annotations

import io
import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

import numpy as np

from . import readers
from .text import words
# The word splitter and hasher live in pipeline.wordhash (one implementation for the whole
# project); re-exported here because callers and tests use them as ngrams.<name>.
from .wordhash import WordHashes, fold, mix64, word_char_table, word_hashes  # noqa: F401
from gristmill.errors import UsageError
from gristmill.manifests.runs import run_starts
from gristmill.manifests.storage import Store, atomic_write, local_path

DEFAULT_N = 13

# Hash constants. Changing any of them, or those of pipeline.wordhash, changes every hash:
# bump HASH_VERSION if you do.
HASH_VERSION = "gristmill-ngram-v2"  # v2: word/gram finaliser is wordhash.mix64 (fmix64)
_M64 = (1 << 64) - 1
_WORD_BASE = np.uint64(0x9E3779B97F4A7C15)
_LEN_SALT = 0xD6E8FEB86659FD93
_CHUNK_CHARS = 1 << 18  # characters hashed per vectorised pass: bounds memory, stays in cache
_FILTER_MAX_BITS = 24  # candidate bitmap: at most 16 MB per process


def gram_hashes(wh: WordHashes, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every run of ``length`` consecutive words inside one text, and their first word."""
    count = len(wh.hashes) - length + 1
    if count <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    g = wh.hashes[:count].copy()
    for j in range(1, length):
        g = g * _WORD_BASE + wh.hashes[j : j + count]
    start = np.flatnonzero(wh.text[:count] == wh.text[length - 1 :])  # does not straddle two texts
    salt = np.uint64((length * _LEN_SALT) & _M64)  # the length is part of a gram's identity
    return mix64(g[start] ^ salt), start


def text_grams(text: str, n: int = DEFAULT_N) -> np.ndarray:
    """The distinct gram hashes of one text as an eval item: its n-grams, or itself if shorter."""
    wh = word_hashes([text])
    if len(wh.hashes) == 0:
        return np.zeros(0, np.uint64)
    return np.unique(gram_hashes(wh, min(n, len(wh.hashes)))[0])


# --------------------------------------------------------------------------------------
# The index


class Match(NamedTuple):
    """Eval item ``item`` of eval set ``eval_set`` occurs in a text: ``hits`` gram positions.

    ``spans`` are the matching word ranges ``[start, end)`` in the text's ``words()``.
    """

    eval_set: str
    item: str
    hits: int
    spans: list[tuple[int, int]]


@dataclass
class NgramIndex:
    """Gram hashes of one or more eval sets -> the items they come from.

    Items are numbered globally in the order they were added; ``set_first[s]`` is the first
    item of eval set ``s``. Pickles compactly (numpy arrays), so ``ray.put`` shares one copy
    with every worker on a node.
    """

    n: int
    set_names: list[str]
    set_first: np.ndarray  # int64 [sets + 1]
    item_ids: list[str]  # [items]
    item_grams: np.ndarray  # int64 [items]: distinct grams of each item (0: too short, not indexed)
    hashes: np.ndarray  # uint64 [grams], sorted, unique
    owner_ptr: np.ndarray  # int64 [grams + 1]: hashes[g] belongs to items owners[owner_ptr[g]:owner_ptr[g+1]]
    owners: np.ndarray  # int64
    lengths: tuple[int, ...]  # gram lengths to look for in a text: n, plus those of short items
    _filter: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def ngrams(self) -> int:
        return len(self.hashes)

    def set_of(self, item: int) -> int:
        return int(np.searchsorted(self.set_first, item, side="right") - 1)

    def items_of(self, name: str) -> list[str]:
        s = self.set_names.index(name)
        return self.item_ids[self.set_first[s] : self.set_first[s + 1]]

    def required_hits(self, item: int, min_matches: int) -> int:
        """An item of k grams needs min(min_matches, k) hits: a short item found whole is a leak."""
        return min(min_matches, int(self.item_grams[item]))

    # -- lookups ----------------------------------------------------------------------------
    def _candidates(self, grams: np.ndarray) -> np.ndarray:
        """Positions of ``grams`` that may be in the index, by a bitmap of top hash bits.

        Nearly every gram of a clean document misses; one table read rules most out, so the
        binary search (a cache miss per step) runs only on the few candidates.
        """
        if self._filter is None:  # built lazily in each process, never pickled or saved
            bits = min(_FILTER_MAX_BITS, max(16, (16 * self.ngrams).bit_length()))
            self._filter = np.zeros(1 << bits, dtype=bool)
            self._filter[self.hashes >> np.uint64(64 - bits)] = True
        bits = len(self._filter).bit_length() - 1
        return np.flatnonzero(self._filter[grams >> np.uint64(64 - bits)])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_filter"] = None
        return state

    def _hits(self, wh: WordHashes):
        """Per gram length: (length, first word of each gram of ``wh`` that is in the index,
        that gram's position in ``hashes``), in word order."""
        for length in self.lengths:
            grams, start = gram_hashes(wh, length)
            if len(grams) == 0 or self.ngrams == 0:
                continue
            cand = self._candidates(grams)
            pos = np.searchsorted(self.hashes, grams[cand]).clip(max=self.ngrams - 1)
            hit = self.hashes[pos] == grams[cand]
            yield length, start[cand[hit]], pos[hit]

    def scan(self, texts: list[str], min_matches: int = 1) -> list[list[Match]]:
        """The matches of each text, item by item (in index order)."""
        out: list[list[Match]] = []
        for chunk in _chunks(texts, _CHUNK_CHARS):
            out.extend(self._scan_chunk(chunk, min_matches))
        return out

    def _scan_chunk(self, texts: list[str], min_matches: int) -> list[list[Match]]:
        wh = word_hashes(texts)
        # (text, item) -> spans of matching grams, gathered only where a hash hits: rare.
        found: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for length, starts, positions in self._hits(wh):
            for w, g in zip(starts.tolist(), positions.tolist()):
                t = int(wh.text[w])
                span = (w - int(wh.first[t]), w - int(wh.first[t]) + length)
                for item in self.owners[self.owner_ptr[g] : self.owner_ptr[g + 1]]:
                    found.setdefault((t, int(item)), []).append(span)
        out: list[list[Match]] = [[] for _ in texts]
        for (t, item), spans in sorted(found.items()):
            if len(spans) >= self.required_hits(item, min_matches):
                s = self.set_of(item)
                out[t].append(Match(self.set_names[s], self.item_ids[item], len(spans), sorted(spans)))
        return out

    def document_frequency(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(gram positions in ``hashes``, number of ``texts`` containing each): only grams of
        this index are counted, so memory follows the index and the hits, not the texts."""
        parts = []
        for chunk in _chunks(texts, _CHUNK_CHARS):
            wh = word_hashes(chunk)
            # (text, gram) as one int64 key; a gram counts once per text
            pairs = [wh.text[starts].astype(np.int64) * self.ngrams + positions for _, starts, positions in self._hits(wh)]
            if pairs:
                keys = np.unique(np.concatenate(pairs))
                parts.append(keys % self.ngrams)
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.unique(np.concatenate(parts), return_counts=True)

    def without(self, drop: np.ndarray) -> "NgramIndex":
        """This index less the grams at the positions ``drop`` (boolean mask over ``hashes``).
        ``item_grams`` keeps each item's full count, so the hits an item needs
        (``required_hits``) do not shrink with it; a dropped gram is never a hit."""
        keep = ~drop
        per_gram = np.diff(self.owner_ptr)
        owners = self.owners[np.repeat(keep, per_gram)]
        ptr = np.concatenate([[0], np.cumsum(per_gram[keep])]).astype(np.int64)
        return NgramIndex(n=self.n, set_names=self.set_names, set_first=self.set_first, item_ids=self.item_ids,
                          item_grams=self.item_grams, hashes=self.hashes[keep], owner_ptr=ptr, owners=owners,
                          lengths=self.lengths)

    # -- persistence (the stage caches the index in its work dir; the audit may reload it) -------
    def save(self, path: str, store: Store | None = None) -> None:
        """Write to an ``.npz`` of ``store`` (None: the store of ``path``), whole or not at all."""
        meta = {"hash_version": HASH_VERSION, "n": self.n, "set_names": self.set_names, "item_ids": self.item_ids,
                "lengths": list(self.lengths)}
        buf = io.BytesIO()
        np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), set_first=self.set_first,
                 item_grams=self.item_grams, hashes=self.hashes, owner_ptr=self.owner_ptr, owners=self.owners)
        atomic_write(path, buf.getvalue(), store)

    @classmethod
    def load(cls, path: str, store: Store | None = None) -> "NgramIndex":
        """An index :meth:`save` wrote to ``path`` of ``store`` (None: the store of ``path``)."""
        store = store or Store.from_url(path)
        # a local file is read by numpy itself; on an object store, one read of the whole object
        with np.load(store.path(path) if store.is_local else io.BytesIO(store.read(path))) as z:
            meta = json.loads(z["meta"].tobytes())
            if meta.get("hash_version") != HASH_VERSION:
                raise EvalFileError(f"{path}: n-gram index built with hash {meta.get('hash_version')!r}, "
                                 f"this gristmill uses {HASH_VERSION!r}; rebuild it")
            return cls(n=meta["n"], set_names=meta["set_names"], set_first=z["set_first"], item_ids=meta["item_ids"],
                       item_grams=z["item_grams"], hashes=z["hashes"], owner_ptr=z["owner_ptr"], owners=z["owners"],
                       lengths=tuple(meta["lengths"]))


def word_char_spans(text: str) -> list[tuple[int, int]] | None:
    """For each word of ``words(text)``, the character range of ``text`` it comes from.

    Normalisation (NFKC, case folding) can change lengths, so offsets are found per
    whitespace-separated token: a token gives zero or more words, all mapped to the token's
    range. Returns None in the (exotic Unicode) case where per-token words do not add up to
    ``words(text)``, so callers never cut at a wrong place.
    """
    spans = []
    for m in _TOKEN.finditer(text):
        spans.extend([(m.start(), m.end())] * len(words(m.group())))
    return spans if len(spans) == len(words(text)) else None


_TOKEN = re.compile(r"\S+")


def find_matches(index: NgramIndex, text: str, min_matches: int = 1) -> list[Match]:
    """The eval items ``text`` contains (no Ray; the audit's leak check)."""
    return index.scan([text], min_matches)[0]


def _chunks(texts: list[str], limit: int) -> Iterable[list[str]]:
    chunk, size = [], 0
    for t in texts:
        if chunk and size + len(t) > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(t)
        size += len(t) + 1
    if chunk or not texts:
        yield chunk


def build_index(eval_sets: Iterable[tuple[str, Iterable[tuple[str, str]]]], n: int = DEFAULT_N,
                min_item_words: int = 1) -> NgramIndex:
    """Index ``[(set_name, [(item_id, text), ...]), ...]``: eval files and validation docs alike.

    Items with fewer than ``min_item_words`` words are kept in ``item_ids`` (so counts match
    the file) but index nothing (``item_grams`` 0), and so never match.
    """
    if n < 1:
        raise UsageError(f"n-gram size must be >= 1, got {n}")
    set_names, set_first, item_ids, texts = [], [0], [], []
    for name, items in eval_sets:
        if name in set_names:
            raise UsageError(f"eval set name {name!r} is used twice; names must be unique")
        set_names.append(name)
        for item_id, text in items:
            item_ids.append(str(item_id))
            texts.append(text or "")
        set_first.append(len(item_ids))
    hash_parts, owner_parts, lengths, done = [], [], {n}, 0
    for chunk in _chunks(texts, _CHUNK_CHARS):  # a batch of items at a time, like documents
        hashes, owners, short = _item_grams(chunk, n, min_item_words)
        hash_parts.append(hashes)
        owner_parts.append(owners + done)
        lengths |= short
        done += len(chunk)
    hashes, owners = np.concatenate(hash_parts), np.concatenate(owner_parts)
    order = np.lexsort((owners, hashes))  # by hash, then item: a deterministic owner order
    hashes, owners = hashes[order], owners[order]
    distinct = run_starts(hashes, owners)  # one entry per (gram, item): repeats in an item count once
    hashes, owners = hashes[distinct], owners[distinct]
    unique, first = np.unique(hashes, return_index=True)
    return NgramIndex(n=n, set_names=set_names, set_first=np.asarray(set_first, np.int64), item_ids=item_ids,
                      item_grams=np.bincount(owners, minlength=len(item_ids)).astype(np.int64), hashes=unique,
                      owner_ptr=np.append(first, len(hashes)).astype(np.int64), owners=owners,
                      lengths=tuple(sorted(lengths, reverse=True)))


def _item_grams(texts: list[str], n: int, min_item_words: int) -> tuple[np.ndarray, np.ndarray, set[int]]:
    """(gram hashes, item of each, short lengths) of a batch of eval items."""
    wh = word_hashes(texts)
    size = np.diff(wh.first)  # words per item
    indexed = size >= max(1, min_item_words)
    hashes, owners, short = [], [], set()
    grams, start = gram_hashes(wh, n)
    item = wh.text[start]
    hashes.append(grams[indexed[item]])
    owners.append(item[indexed[item]])
    for length in np.unique(size[indexed & (size < n)]).tolist():  # short items: the whole item, once
        grams, start = gram_hashes(wh, length)
        item = wh.text[start]
        mine = size[item] == length
        hashes.append(grams[mine])
        owners.append(item[mine])
        short.add(length)
    return np.concatenate(hashes), np.concatenate(owners).astype(np.int64), short


# --------------------------------------------------------------------------------------
# Eval files

FORMATS = ("jsonl", "parquet", "text")
TEXT_SPLITS = ("auto", "line", "paragraph")
_COMPRESSION_SUFFIXES = (".gz", ".zst", ".bz2", ".xz")  # stripped to tell the format; .gz/.zst are read
_SUFFIX_FORMAT = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                  ".txt": "text", ".text": "text", ".md": "text"}
_BLANK_LINE = re.compile(r"\n[ \t\r]*\n")


def infer_format(path: str) -> str:
    base = path.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        base = base.removesuffix(suffix)
    fmt = _SUFFIX_FORMAT.get(posixpath.splitext(base)[1])
    if fmt is None:
        raise UsageError(f"eval file {path}: cannot tell its format from the name; set format to one of {FORMATS}")
    return fmt


def read_eval_items(path: str, fmt: str | None = None, fields: Iterable[str] = ("text",), id_field: str | None = None,
                    split: str = "auto", max_record_bytes: int | None = None, *,
                    store: Store | None = None, follow_symlinks: bool = False) -> list[tuple[str, str]]:
    """The items of an eval file as ``(item_id, text)``, in file order.

    - JSONL (optionally .gz/.zst, as input files): one object per non-blank line; the item is its
      ``fields`` joined by newlines (a list value, e.g. answer choices, joins its elements).
    - Parquet: the same, one row per item.
    - Plain text: ``split="line"`` one item per non-blank line, ``"paragraph"`` one per
      blank-line-separated block; ``"auto"`` (default) is paragraphs if the file has a blank
      line, lines otherwise.

    The item id is ``id_field``'s value, or the item's 0-based number in the file.

    Read through the input readers' bounds (``pipeline.readers``): only a regular file is opened
    (a FIFO or /dev/zero is refused before a byte is read), decompression is bounded per call,
    and no line (JSONL, text), paragraph or item (Parquet) over ``max_record_bytes`` (default
    ``extract.max_record_bytes``'s, 64 MiB) is held: each is one ``EvalFileError`` line naming
    the file and where. Memory is that bound plus the items kept. ``store``: the file's store,
    opened with its storage options (None: the URL's, with none). Unless ``follow_symlinks``, a
    file that a symlink takes outside its folder is refused unread (docs/security.md).
    """
    store = store or Store.from_url(path)
    limit = max_record_bytes or readers.MAX_RECORD_BYTES
    fmt = fmt or infer_format(path)
    fields = list(fields)
    if fmt not in FORMATS:
        raise UsageError(f"eval file {path}: unknown format {fmt!r}; expected one of {FORMATS}")
    _check_eval_file(path, store, follow_symlinks)
    if fmt == "jsonl":
        records = _read_jsonl(path, limit, store)
    elif fmt == "parquet":
        records = _read_parquet(path, fields + ([id_field] if id_field else []), store)
    else:
        return _read_text(path, split, limit, store)
    items, seen = [], set()
    for number, (where, rec) in enumerate(records):
        item_id = str(number) if id_field is None else str(_field(rec, id_field, path, where))
        if item_id in seen:
            raise UsageError(f"eval file {path} {where}: item id {item_id!r} (field {id_field!r}) is not unique")
        seen.add(item_id)
        try:
            text = "\n".join(_as_text(_field(rec, f, path, where)) for f in fields)
        except RecursionError:  # str() of an object nested deeper than the interpreter recurses
            raise _unreadable(path, where, RecursionError()) from None
        if readers.longer_than(text, limit):
            raise _too_long(path, where, limit)
        items.append((item_id, text))
    return items


def _field(rec: dict, name: str, path: str, where: str):
    if name not in rec:
        raise UsageError(f"eval file {path} {where}: no field {name!r} (fields: {', '.join(sorted(rec))})")
    return rec[name]


def _as_text(value) -> str:
    """A field's text: a string as it is, a list's elements (nested lists too) one per line, None
    empty, anything else as ``str``. A loop, not recursion: a list nested 900 deep parses."""
    parts, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)) and v:
            stack.extend(reversed(v))
        else:
            parts.append(v if isinstance(v, str) else "" if v is None or isinstance(v, (list, tuple)) else str(v))
    return "\n".join(parts)


class EvalFileError(UsageError):
    """An eval file that cannot be read as its format says: the message names the file and the
    line (row, or byte) where reading stopped, so ``prepare`` and ``audit leak`` print one line."""


def _unreadable(path: str, where: str, e: BaseException) -> EvalFileError:
    what = "not valid UTF-8" if isinstance(e, UnicodeDecodeError) else \
        "nested too deeply to parse" if isinstance(e, RecursionError) else f"{type(e).__name__}: {' '.join(str(e).split())}"
    return EvalFileError(f"eval file {path}{' ' + where if where else ''}: {what}; fix or replace the file")


def _too_long(path: str, where: str, limit: int) -> EvalFileError:
    return EvalFileError(f"eval file {path} {where}: longer than {limit:,} bytes (extract.max_record_bytes); "
                         "split it into items, or raise the limit if it really is one item")


def _check_eval_file(path: str, store: Store, follow_symlinks: bool = False) -> None:
    """A regular file, in a compression the input readers decode: a FIFO would block forever and
    /dev/zero never ends; a .bz2 would be read as its compressed bytes. Unless ``follow_symlinks``,
    one that resolves outside its folder through a symlink is refused unread, as input files are."""
    other = next((s for s in _COMPRESSION_SUFFIXES if path.lower().endswith(s) and s not in readers.COMPRESSIONS), None)
    if other:
        raise EvalFileError(f"eval file {path}: {other} is not a compression gristmill reads (it reads "
                            f"{', '.join(readers.COMPRESSIONS)}, as for input files); recompress it")
    try:
        p = store.path(path)
        info = store.fs.info(p)
    except OSError as e:
        what = "no such file" if isinstance(e, FileNotFoundError) else f"cannot be read: {e.strerror or e}"
        raise EvalFileError(f"eval file {path}: {what}") from None
    if info.get("type") != "file":
        what = readers.special_file(p) if local_path(path) is not None else "not a regular file"
        raise EvalFileError(f"eval file {path} is {what}, not a regular file; copy its contents to a file and name that")
    folder = posixpath.dirname(path) or "."
    if not follow_symlinks and (target := store.escapes(path, folder)) is not None:
        raise EvalFileError(f"eval file {path} is a symlink to {target}, outside its folder {folder} "
                            f"({readers.SYMLINK_OUTSIDE_ROOT}); not read. Copy the file into the folder, "
                            "or set follow_symlinks: true on its eval set")


def _eval_lines(path: str, limit: int, store: Store) -> Iterable[tuple[int, bytes]]:
    """(line number, line) of the file, decompressed by name as input files are
    (``readers.open_stream``); a line over ``limit`` bytes is an EvalFileError, read no further."""
    with readers.open_file(path, store) as f:
        for lineno, (line, _, _) in enumerate(readers.bounded_lines(readers.open_stream(f, path), limit,
                                                                    read_past=False), 1):
            if line is None:
                raise _too_long(path, f"line {lineno}", limit)
            yield lineno, line


def _read_jsonl(path: str, limit: int, store: Store) -> list[tuple[str, dict]]:
    out, lineno = [], 0
    try:
        for lineno, raw in _eval_lines(path, limit, store):
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            rec = readers.json_object(line)
            if isinstance(rec, readers.BadJson):
                raise EvalFileError(f"eval file {path} line {lineno}: {rec.detail}; fix or replace the file")
            out.append((f"line {lineno}", rec))
    except (UnicodeDecodeError, OSError) as e:  # OSError: a cut or corrupt .gz/.zst (readers.DamagedStream)
        raise _unreadable(path, f"line {lineno + 1}" if not isinstance(e, UnicodeDecodeError) else f"line {lineno}",
                          e) from None
    return out


def _read_parquet(path: str, columns: list[str], store: Store) -> list[tuple[str, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with readers.open_file(path, store) as f:
            schema = pq.read_schema(f)
            missing = [c for c in dict.fromkeys(columns) if c not in schema.names]
            if missing:
                raise EvalFileError(f"eval file {path}: no column(s) {', '.join(map(repr, missing))} "
                                    f"(columns: {', '.join(schema.names)})")
            f.seek(0)
            rows = pq.read_table(f, columns=list(dict.fromkeys(columns))).to_pylist()
    except (pa.ArrowException, OSError, ValueError) as e:
        if isinstance(e, EvalFileError):
            raise
        raise _unreadable(path, "", e) from None
    return [(f"row {i}", r) for i, r in enumerate(rows)]


def _read_text(path: str, split: str, limit: int, store: Store) -> list[tuple[str, str]]:
    if split not in TEXT_SPLITS:
        raise EvalFileError(f"eval file {path}: split must be one of {TEXT_SPLITS}, got {split!r}")
    lines, lineno = [], 0
    try:
        for lineno, raw in _eval_lines(path, limit, store):
            lines.append(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _unreadable(path, f"line {lineno}", e) from None
    except OSError as e:
        raise _unreadable(path, f"line {lineno + 1}", e) from None
    text = "".join(lines).replace("\r\n", "\n")
    if split == "auto":
        split = "paragraph" if _BLANK_LINE.search(text.strip()) else "line"
    blocks = _BLANK_LINE.split(text) if split == "paragraph" else text.split("\n")
    items = [(str(i), b.strip()) for i, b in enumerate(b for b in blocks if b.strip())]
    long = next((i for i, b in items if readers.longer_than(b, limit)), None)
    if long is not None:
        raise _too_long(path, f"item {long} (a paragraph)", limit)
    return items


def index_from_file(path: str, name: str, n: int = DEFAULT_N, fmt: str | None = None,
                    fields: Iterable[str] = ("text",), id_field: str | None = None, split: str = "auto",
                    min_item_words: int = 1, max_record_bytes: int | None = None) -> NgramIndex:
    """Build the index of one eval file (the audit's entry point: the one file its user names on the
    command line, so a link is followed, unlike a job's eval sets)."""
    items = read_eval_items(path, fmt, fields, id_field, split, max_record_bytes, follow_symlinks=True)
    return build_index([(name, items)], n=n, min_item_words=min_item_words)
