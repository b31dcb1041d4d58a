"""The manifest: one dataset version, named by the sha256 of its canonical JSON.

Everything downstream (loader, trainer, audit) trusts only what a manifest's hash pins.
The hashed part excludes the fields that name *where* or *when* a version was published
(``version``, ``created_at``) and the hash itself, so publishing the same content twice
gives the same hash. See docs/format.md for the exact schema.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Any

from .errors import (EditedManifestError, HashMismatchError, ManifestDecodeError, ManifestError, MissingFieldError, SchemaVersionError,
                     UnsafePathError)
from .hashing import canonical_json, sha256_bytes, sha256_json
from .storage import is_url

SCHEMA_VERSION = 1
UNHASHED_FIELDS = ("version", "created_at", "sha256")
SPLITS = ("train", "validation")
# Bounds on the counts a manifest states, so that no stated number (however forged) overflows the
# int64 arithmetic of the loader's order and row offsets: a shard's tokens times 4 bytes and the
# rows of all shards together stay far below 2**63.
MAX_COUNT = 1 << 48
MAX_TOTAL_ROWS = 1 << 62
MAX_SEQ_LEN = 1 << 31
MAX_VOCAB = 1 << 32


def safe_relpath(path: str, what: str) -> str:
    """A path inside the dataset version directory, exactly as written: ``/``-separated segments, none
    empty, ``.`` or ``..``, with no control character (NUL included), backslash or ``:``; not absolute
    and no URL, fsspec chain (``::``) or drive. Anything else is an UnsafePathError naming it (never
    normalised: the path is hashed as written)."""
    if not isinstance(path, str) or not path:
        raise UnsafePathError(f"{what}: path must be a non-empty string, got {path!r}")
    if path.startswith(("/", "\\")) or is_url(path) or (len(path) > 1 and path[1] == ":"):
        raise UnsafePathError(f"{what}: path {path!r} is absolute; manifest paths are relative to the dataset version directory")
    if ":" in path:  # fsspec reads 'a::b' as a chain of filesystems and 'x:y' as a protocol: never a plain name
        raise UnsafePathError(f"{what}: path {path!r} holds ':'; a manifest path is a plain relative path, not an "
                              "fsspec URL or chain")
    bad = next((c for c in path if ord(c) < 0x20 or c in "\x7f\\"), None)
    if bad is not None:
        raise UnsafePathError(f"{what}: path {path!r} holds {bad!r}; a manifest path has no control characters or "
                              f"backslashes (segments separated by '/')")
    segments = path.split("/")
    if ".." in segments:
        raise UnsafePathError(f"{what}: path {path!r} escapes the dataset version directory")
    if any(seg in ("", ".") for seg in segments):
        raise UnsafePathError(f"{what}: path {path!r} has an empty or '.' segment; write it as plain name/name segments")
    return path


def _require(d: dict, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(d, dict):
        raise ManifestError(f"{where}: expected an object, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    if missing:
        raise MissingFieldError(f"{where}: missing field(s) {', '.join(missing)}")


def _int(d: dict, key: str, where: str, hi: int = MAX_COUNT, lo: int = 0) -> int:
    """A stated count: a JSON integer in [lo, hi), else an error naming the field and value."""
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < hi:
        raise ManifestError(f"{where}.{key}: expected an integer in [{lo}, {hi}), got {value!r}")
    return value


def _list(d: dict, key: str, where: str) -> list:
    value = d.get(key, [])
    if not isinstance(value, list):
        raise ManifestError(f"{where}.{key}: expected a list, got {type(value).__name__}")
    return value


def _sha(value: Any, where: str) -> str:
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise ManifestError(f"{where}: not a lowercase hex sha256: {value!r}")
    return value


@dataclass(frozen=True)
class FileRef:
    """A file the manifest pins: relative path (inside the version dir), sha256, size, and (the
    document index) its row count. ``rows`` is None when not stated: manifests written before it
    existed lack it, and it is left out of their JSON (and so of their hash)."""

    path: str
    sha256: str
    bytes: int
    rows: int | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "FileRef":
        _require(d, ("path", "sha256", "bytes"), where)
        rows = _int(d, "rows", where, hi=MAX_TOTAL_ROWS) if d.get("rows") is not None else None
        return cls(path=safe_relpath(d["path"], where), sha256=_sha(d["sha256"], where), bytes=_int(d, "bytes", where),
                   rows=rows)

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["rows"] is None:
            del d["rows"]
        return d


@dataclass(frozen=True)
class Shard:
    """A token shard: ``rows`` packed sequences of ``seq_len + 1`` tokens each.

    ``sha256``/``bytes`` pin the published (zstd) file; ``raw_sha256``/``raw_bytes`` pin the
    uncompressed cache form the loader memory-maps, so a cached copy can be re-verified too.
    """

    path: str
    split: str
    sha256: str
    bytes: int
    rows: int
    tokens: int
    raw_sha256: str
    raw_bytes: int

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "Shard":
        _require(d, ("path", "split", "sha256", "bytes", "rows", "tokens", "raw_sha256", "raw_bytes"), where)
        if d["split"] not in SPLITS:
            raise ManifestError(f"{where}: split must be one of {SPLITS}, got {d['split']!r}")
        return cls(
            path=safe_relpath(d["path"], where),
            split=d["split"],
            sha256=_sha(d["sha256"], where),
            bytes=_int(d, "bytes", where),
            rows=_int(d, "rows", where),
            tokens=_int(d, "tokens", where),
            raw_sha256=_sha(d["raw_sha256"], where),
            raw_bytes=_int(d, "raw_bytes", where),
        )


@dataclass(frozen=True)
class Tokenizer:
    path: str  # tokenizer.json inside the version dir
    sha256: str
    vocab_size: int
    eos_id: int
    # What encoded the tokens and its version ("tiktoken 0.14.0", "tokenizers 0.23.3"): a fact, not an
    # input (either gives the same ids). Optional and left out of the JSON (so of the hash) when empty:
    # manifests written before it keep their hash.
    encoder: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        if not self.encoder:
            del d["encoder"]
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "tokenizer") -> "Tokenizer":
        _require(d, ("path", "sha256", "vocab_size", "eos_id"), where)
        vocab = _int(d, "vocab_size", where, hi=MAX_VOCAB + 1, lo=1)
        encoder = d.get("encoder", "")
        if not isinstance(encoder, str) or "encoder" in d and not encoder:
            raise ManifestDecodeError(f"{where}.encoder: {encoder!r} is not a non-empty string")
        return cls(safe_relpath(d["path"], where), _sha(d["sha256"], where), vocab, _int(d, "eos_id", where, hi=vocab),
                   encoder)


@dataclass(frozen=True)
class Input:
    uri: str
    bytes: int
    sha256: str

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "Input":
        _require(d, ("uri", "bytes", "sha256"), where)
        return cls(str(d["uri"]), _int(d, "bytes", where), _sha(d["sha256"], where))


@dataclass(frozen=True)
class PinnedVersion:
    """An earlier version this one was deduplicated against (``dedup_against``): where it was read,
    what it is, and the manifest hash that pinned it."""

    url: str
    dataset: str
    version: int
    sha256: str

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "PinnedVersion":
        _require(d, ("url", "dataset", "version", "sha256"), where)
        return cls(str(d["url"]), str(d["dataset"]), _int(d, "version", where, lo=1), _sha(d["sha256"], where))


@dataclass(frozen=True)
class EvalSet:
    """An evaluation set the dataset was decontaminated against (name, file, content hash)."""

    name: str
    uri: str
    sha256: str
    items: int

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "EvalSet":
        _require(d, ("name", "uri", "sha256", "items"), where)
        return cls(str(d["name"]), str(d["uri"]), _sha(d["sha256"], where), _int(d, "items", where))


REQUIRED = (
    "schema_version", "dataset", "tokenizer", "seq_len", "token_dtype", "shards",
    "doc_index", "inputs", "config", "config_sha256", "code_version", "stats",
)


class VersionedDocument:
    """What a dataset manifest and a mixture manifest (manifests.mixture) share: JSON that records its
    own hash, published as a numbered version."""

    def to_json(self) -> str:
        d = self.to_dict()
        d["sha256"] = self.sha256
        return json.dumps(d, sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    def published(self, version: int):
        now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
        return replace(self, version=version, created_at=now)


def checked_sha256(m: VersionedDocument, d: dict, expected_sha256: str | None, what: str,
                   unhashed: tuple[str, ...] = UNHASHED_FIELDS) -> str:
    """``m``'s hash, refused if it differs from the one ``d`` records (an edit) or the caller pins.

    The documented identity is the hash of the file's own JSON object ``d`` (minus ``unhashed``); the
    code hashes what it parsed, ``m.to_dict()``. They must be the same bytes: a field this gristmill
    does not read (an unknown key), or a value it would read as another (``1.0`` for ``1``, a number
    for a string, a default filled in), is refused here rather than left outside the hash."""
    try:
        ours = {k: v for k, v in m.to_dict().items() if k not in unhashed}
        sha = sha256_bytes(canonical_json(ours))
        theirs = {k: v for k, v in d.items() if k not in unhashed}
        same = canonical_json(theirs) == canonical_json(ours)
    except UnicodeEncodeError as e:  # JSON can escape a lone surrogate (\udcff), which has no UTF-8
        raise ManifestDecodeError(f"{what}: a string is not valid Unicode ({e}); it cannot be hashed") from e
    except (ValueError, TypeError) as e:  # NaN or Infinity (no JSON), or a value JSON cannot hold
        raise ManifestDecodeError(f"{what}: holds a value that is not JSON ({e}); it cannot be hashed") from e
    if not same:
        differ = sorted(k for k in set(theirs) | set(ours)
                        if k not in theirs or k not in ours or canonical_json(theirs[k]) != canonical_json(ours[k]))
        raise ManifestError(f"{what}: field(s) {', '.join(differ)} hold(s) what this gristmill does not read as written "
                            f"(an unknown field, a value of another type, or a missing default): every field but "
                            f"{', '.join(unhashed)} is hashed exactly as written, so refusing")
    recorded = d.get("sha256")
    if recorded is not None and recorded != sha:
        raise EditedManifestError(f"{what}.json (its content was edited after publishing)", recorded, sha)
    if expected_sha256 is not None and expected_sha256 != sha:
        raise HashMismatchError(f"{what} of {m.dataset!r} (hash pinned by the caller)", expected_sha256, sha)
    return sha


@dataclass(frozen=True)
class Manifest(VersionedDocument):
    dataset: str
    tokenizer: Tokenizer
    seq_len: int
    token_dtype: str
    shards: tuple[Shard, ...]
    doc_index: FileRef
    inputs: tuple[Input, ...]
    config: dict
    config_sha256: str
    code_version: str
    stats: dict
    eval_sets: tuple[EvalSet, ...] = ()
    # Both optional and left out of the JSON (so of the hash) when empty: manifests written before
    # them keep their hash. dedup_index: the version's dedup index files (manifests.dedup_index);
    # dedup_against: the earlier versions its documents were deduplicated against.
    dedup_index: tuple[FileRef, ...] = ()
    dedup_against: tuple[PinnedVersion, ...] = ()
    schema_version: int = SCHEMA_VERSION
    version: int | None = None
    created_at: str | None = None

    # -- identity -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)  # the shards, inputs and eval sets as dicts already (asdict recurses)
        for key in ("shards", "inputs", "eval_sets"):
            d[key] = list(d[key])
        d["doc_index"] = self.doc_index.to_dict()
        d["tokenizer"] = self.tokenizer.to_dict()
        for key in ("dedup_index", "dedup_against"):
            if getattr(self, key):
                d[key] = [f.to_dict() if isinstance(f, FileRef) else asdict(f) for f in getattr(self, key)]
            else:
                del d[key]
        return d

    @cached_property
    def sha256(self) -> str:
        """The manifest's identity, computed once (~0.4 s at 20,000 shards; the loader, the trainer and the
        server ask for it often): a Manifest is never changed in place, ``dataclasses.replace`` makes a
        new one, which computes its own."""
        return content_sha256(self.to_dict())

    @property
    def row_tokens(self) -> int:
        """Tokens stored per row: ``seq_len`` inputs plus one so every position has a label."""
        return self.seq_len + 1

    def shards_of(self, split: str) -> tuple[Shard, ...]:
        return tuple(s for s in self.shards if s.split == split)

    # -- parsing --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict, *, expected_sha256: str | None = None) -> "Manifest":
        if not isinstance(d, dict):
            raise ManifestError(f"manifest: expected a JSON object, got {type(d).__name__}")
        if d.get("kind") == "mixture":  # manifests.mixture: it pins dataset manifests, not shards
            raise ManifestError("manifest: this is a mixture manifest (written by `gristmill mix`), not a dataset's; "
                                "the loader, `gristmill train` and the audit accept it; dataset tools need one of its "
                                "components")
        if "schema_version" in d and (type(d["schema_version"]) is not int or d["schema_version"] != SCHEMA_VERSION):
            raise SchemaVersionError(
                f"manifest: unknown schema_version {d['schema_version']!r}; this gristmill reads version {SCHEMA_VERSION}"
            )
        _require(d, REQUIRED, "manifest")
        if d["token_dtype"] not in ("uint16", "uint32"):
            raise ManifestError(f"manifest: token_dtype must be uint16 or uint32, got {d['token_dtype']!r}")
        for key in ("config", "stats"):
            if not isinstance(d[key], dict):
                raise ManifestError(f"manifest.{key}: expected an object, got {type(d[key]).__name__}")
        m = cls(
            dataset=str(d["dataset"]),
            tokenizer=Tokenizer.from_dict(d["tokenizer"]),
            seq_len=_int(d, "seq_len", "manifest", hi=MAX_SEQ_LEN, lo=1),
            token_dtype=d["token_dtype"],
            shards=tuple(Shard.from_dict(s, f"shards[{i}]") for i, s in enumerate(_list(d, "shards", "manifest"))),
            doc_index=FileRef.from_dict(d["doc_index"], "doc_index"),
            inputs=tuple(Input.from_dict(x, f"inputs[{i}]") for i, x in enumerate(_list(d, "inputs", "manifest"))),
            config=d["config"],
            config_sha256=_sha(d["config_sha256"], "config_sha256"),
            code_version=str(d["code_version"]),
            stats=d["stats"],
            eval_sets=tuple(EvalSet.from_dict(e, f"eval_sets[{i}]") for i, e in enumerate(_list(d, "eval_sets", "manifest"))),
            dedup_index=tuple(FileRef.from_dict(f, f"dedup_index[{i}]")
                              for i, f in enumerate(_list(d, "dedup_index", "manifest"))),
            dedup_against=tuple(PinnedVersion.from_dict(p, f"dedup_against[{i}]")
                                for i, p in enumerate(_list(d, "dedup_against", "manifest"))),
            schema_version=SCHEMA_VERSION,
            version=d.get("version"),
            created_at=d.get("created_at"),
        )
        paths = [s.path for s in m.shards]
        if len(set(paths)) != len(paths):
            raise ManifestError("manifest: two shards share a path")
        index_paths = [f.path for f in m.dedup_index]
        if len(set(index_paths)) != len(index_paths) or set(index_paths) & {*paths, m.doc_index.path, m.tokenizer.path}:
            raise ManifestError("manifest: a dedup_index file shares its path with another pinned file")
        checked_sha256(m, d, expected_sha256, "manifest")
        # Consistency of the stated counts (after the hash checks: an edited manifest is named as such).
        if sha256_json(m.config) != m.config_sha256:
            raise ManifestError(f"manifest.config_sha256: {m.config_sha256} is not the sha256 of config "
                                f"({sha256_json(m.config)}): config was edited after the run")
        for i, s in enumerate(m.shards):
            if s.tokens != s.rows * m.row_tokens:
                raise ManifestError(f"shards[{i}].tokens: {s.tokens} is not rows * (seq_len + 1) = "
                                    f"{s.rows} * {m.row_tokens}")
        if sum(s.rows for s in m.shards) >= MAX_TOTAL_ROWS:
            raise ManifestError(f"manifest: the shards state {sum(s.rows for s in m.shards)} rows in all, "
                                f"more than {MAX_TOTAL_ROWS}")
        return m

    @classmethod
    def from_json(cls, text: str | bytes, *, expected_sha256: str | None = None,
                  source: str = "manifest") -> "Manifest":
        return cls.from_dict(parse_json(text, source), expected_sha256=expected_sha256)


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ManifestDecodeError(f"key {dup!r} appears twice in one object: which one the hash covers would depend "
                                  f"on the reader")
    return dict(pairs)


def _no_constant(name: str):
    raise ManifestDecodeError(f"{name} is not a JSON number (a manifest holds only finite numbers)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ManifestDecodeError(f"{text[:40]} is out of range for a JSON number (a manifest holds only finite numbers)")
    return value


def parse_json(text: str | bytes, source: str = "manifest") -> Any:
    """A manifest file's JSON, strictly: UTF-8, no duplicate keys, no NaN or Infinity, no number out of
    range (``1e999``, an integer of thousands of digits); anything else is a one-line ManifestDecodeError."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite)
    except ManifestDecodeError as e:
        raise ManifestDecodeError(f"{source}: {e}") from None
    except UnicodeDecodeError as e:
        raise ManifestDecodeError(f"{source}: not UTF-8 text ({e})") from e
    except (ValueError, RecursionError) as e:  # JSONDecodeError, and int()'s digit limit
        raise ManifestDecodeError(f"{source}: not valid JSON: {e}") from e


def content_sha256(d: dict) -> str:
    """sha256 of the canonical JSON of a manifest dict, minus the unhashed fields."""
    return sha256_bytes(canonical_json({k: v for k, v in d.items() if k not in UNHASHED_FIELDS}))


def token_dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"
