"""The wire protocol of ``gristmill serve``: one request, one reply schema.

A batch is a pure function of (manifest sha256, split, seed, order, window_shards, global_batch,
step, rank, world_size, documents), so a request names all of them and the server keeps no
per-client state: any replica answers any request, and failover is the same request sent to
another endpoint.

**Request** (:class:`Request`): the JSON object of its fields, UTF-8, as the Flight ``Ticket``
of a ``do_get``. It asks for ``steps`` consecutive steps from ``start_step`` of one rank.
Everything is checked (:meth:`Request.decode`): unknown or missing fields, types, bounds, the
ticket's size; a bad one is a :class:`ProtocolError` (a ``UsageError``) of one line. Its
``version`` is the protocol's (:data:`PROTOCOL_VERSION`); a request of another version, or of none
(a client from before versions: protocol 1, a record batch a step), is refused in one line naming
both versions, never answered in a framing the client would misread. A server from before versions
refuses a versioned request as an unknown field; the client says which side to upgrade.

**Reply** (protocol 2): an Arrow stream of record batches, each a group of consecutive steps (the
server's assembled chunk: as many steps as fit its assembly bounds, at least one), in step order,
together exactly the ``steps`` asked for. Each carries the app-metadata
``{"first_step": s, "steps": n}`` (:func:`group_metadata`) and its ``n * local_batch`` rows, step
``s``'s first, then ``s + 1``'s...; the client checks the groups' framing once per record batch,
every row's global index (and so its step) once per reply, vectorised, and slices each step's batch
as views. Columns (:func:`reply_schema`):

- ``tokens``: ``FixedSizeList<uint16|uint32>[seq_len + 1]``, the rows as stored (the shards'
  dtype; the client widens to its ``token_dtype`` when it asks for a wider one);
- ``indices``: ``int64``, each row's global sample index;
- ``position_ids``: ``FixedSizeList<int32>[seq_len]``, only when ``documents``: each input
  token's offset in its segment; ``cu_seqlens`` and ``max_seqlen`` follow from
  ``position_ids == 0`` (``loader.documents.segments_to_batch``, the one implementation), so
  they are not sent.

The stream's schema metadata carries ``manifest_sha256`` and the request's JSON, so a client
checks every reply against what it asked for (a reply for another manifest is refused and the
range retried elsewhere).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields

import numpy as np
import pyarrow as pa

from gristmill.errors import UsageError

from ..order import DEFAULT_WINDOW_SHARDS, ORDERS

# 1: a record batch a step (no version field); 2: a record batch a group of steps, ``{"first_step", "steps"}``
PROTOCOL_VERSION = 2
MAX_TICKET_BYTES = 4096  # a request's JSON is ~300 bytes
MAX_GLOBAL_BATCH = 1 << 24  # as trainer/config.py's MAX_BATCH
MAX_STEPS = 1024  # steps per request
MAX_ROWS = 1 << 20  # rows per request (steps * global_batch / world_size): bounds one stream's work
DEFAULT_MAX_REPLY_BYTES = 256 << 20  # a server's default bound on one reply's bytes (ServeConfig.max_reply_bytes)
MAX_START_STEP = 1 << 40
MAX_INDEX = 1 << 62  # the global indices a request covers stay inside int64
MAX_WINDOW_SHARDS = 1 << 16
MAX_SEED = 1 << 63
SPLIT = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SHA256 = re.compile(r"[0-9a-f]{64}")

TOKEN_ENV = "GRISTMILL_SERVE_TOKEN"  # the bearer token, when neither side is given one (server and client)
# A client's identity, sent with its token (a pod's hostname by default): the server's admission bounds are per
# identity (loader/service/admission.py), so the ranks of one host share one and two pods behind a NAT do not.
CLIENT_HEADER = "gristmill-client"
CLIENT_ID = re.compile(r"[A-Za-z0-9_.:@/-]{1,128}")

META_SHA = b"gristmill.manifest_sha256"  # schema metadata keys of a reply
META_REQUEST = b"gristmill.request"


class ProtocolError(UsageError):
    """A request (or a reply) that breaks the protocol; its message is one line."""


@dataclass(frozen=True)
class Request:
    """``steps`` consecutive steps from ``start_step`` of rank ``rank`` of ``world_size``."""

    manifest_sha256: str
    split: str = "train"
    seed: int = 0
    order: str = "global"
    window_shards: int = DEFAULT_WINDOW_SHARDS
    global_batch: int = 32
    rank: int = 0
    world_size: int = 1
    start_step: int = 0
    steps: int = 1
    documents: bool = False
    version: int = PROTOCOL_VERSION

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            want = {"str": str, "int": int, "bool": bool}[f.type]
            if type(value) is not want:  # noqa: E721 - exact: a bool is not an int here, nor an int a bool
                _fail(f"{f.name}: expected {f.type}, got {type(value).__name__}")
        _check(self.version == PROTOCOL_VERSION,
               f"version: protocol {self.version}, this server speaks protocol {PROTOCOL_VERSION}; run one gristmill "
               f"release on both sides (upgrade the older)")
        _check(SHA256.fullmatch(self.manifest_sha256), "manifest_sha256: expected 64 lowercase hex digits")
        _check(SPLIT.fullmatch(self.split), "split: expected 1-64 characters of [A-Za-z0-9_.-]")
        _check(self.order in ORDERS, f"order: expected one of {', '.join(ORDERS)}, got {self.order[:32]!r}")
        _check(-MAX_SEED <= self.seed < MAX_SEED, "seed: out of the int64 range")
        _check(1 <= self.window_shards <= MAX_WINDOW_SHARDS, f"window_shards: expected 1..{MAX_WINDOW_SHARDS}")
        _check(1 <= self.global_batch <= MAX_GLOBAL_BATCH, f"global_batch: expected 1..{MAX_GLOBAL_BATCH}")
        _check(1 <= self.world_size <= self.global_batch, "world_size: expected 1..global_batch")
        _check(0 <= self.rank < self.world_size, f"rank: expected 0 <= rank < world_size ({self.world_size})")
        _check(self.global_batch % self.world_size == 0, "global_batch: not divisible by world_size")
        _check(0 <= self.start_step <= MAX_START_STEP, f"start_step: expected 0..{MAX_START_STEP}")
        _check(1 <= self.steps <= MAX_STEPS, f"steps: expected 1..{MAX_STEPS} per request")
        _check(self.steps * self.local_batch <= MAX_ROWS, f"steps * local batch: more than {MAX_ROWS} rows in one request")
        _check((self.start_step + self.steps) * self.global_batch <= MAX_INDEX,
               f"(start_step + steps) * global_batch: past global index 2^62")

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.world_size

    def first_index(self, step: int) -> int:
        """The first global index of this rank's rows at ``step``."""
        return step * self.global_batch + self.rank * self.local_batch

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "Request":
        """The request a ticket holds, checked; anything else is one ``ProtocolError`` line."""
        d = json_object(data, "ticket")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        _check(not unknown, f"unknown field {', '.join(repr(k[:32]) for k in unknown[:3])}; fields: {', '.join(sorted(known))}")
        _check("manifest_sha256" in d, "manifest_sha256: missing")
        _check("version" in d, f"version: missing: a client older than this server (protocol 1, a record batch a step); "
                               f"this server speaks protocol {PROTOCOL_VERSION}: upgrade the client's gristmill")
        return cls(**d)


def json_object(data: bytes, what: str) -> dict:
    """The JSON object ``data`` holds (at most MAX_TICKET_BYTES; deep nesting is refused by the parser's
    recursion bound), else a one-line ``ProtocolError`` naming ``what`` (a ticket, an action body)."""
    if len(data) > MAX_TICKET_BYTES:
        _fail(f"{what} of {len(data)} bytes; at most {MAX_TICKET_BYTES}")
    try:
        d = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        _fail(f"{what} is not a JSON request (a UTF-8 JSON object of the fields)")
    if not isinstance(d, dict):
        _fail(f"{what} is JSON {type(d).__name__}, not an object of the fields")
    return d


def _check(ok, message: str) -> None:
    if not ok:
        _fail(message)


def _fail(message: str):
    raise ProtocolError(f"bad request: {message}")


def one_line(e: BaseException) -> str:
    """An error's first line (a one-line message for a Flight error or a log line)."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def group_metadata(first_step: int, steps: int) -> bytes:
    """A reply record batch's app metadata: the group of ``steps`` steps from ``first_step`` it holds."""
    return b'{"first_step": %d, "steps": %d}' % (first_step, steps)


def reply_schema(manifest, documents: bool) -> pa.Schema:
    """A reply's columns (without its metadata): what the server sends and the client checks a reply against."""
    columns = [("tokens", pa.list_(pa.from_numpy_dtype(np.dtype(manifest.token_dtype)), manifest.row_tokens)),
               ("indices", pa.int64())]
    if documents:
        columns.append(("position_ids", pa.list_(pa.int32(), manifest.seq_len)))
    return pa.schema(columns)


def step_bytes(manifest, local_batch: int, documents: bool) -> int:
    """The bytes of one step of a reply: tokens as stored, int64 indices, int32 position ids with documents."""
    row = manifest.row_tokens * np.dtype(manifest.token_dtype).itemsize + 8 + (4 * manifest.seq_len if documents else 0)
    return local_batch * row


def reply_bytes(manifest, req: "Request") -> int:
    """The bytes of ``req``'s whole reply (the server's ``max_reply_bytes`` bounds it)."""
    return req.steps * step_bytes(manifest, req.local_batch, req.documents)
