"""Arrow Flight's gRPC messages, encoded and decoded by hand for the few verbs ``gristmill serve`` answers.

The server is a ``grpcio`` server speaking Flight's protobuf service (``arrow.flight.protocol.FlightService``),
not pyarrow's ``FlightServerBase``: Flight's C++ server lifts gRPC's receive limit to unlimited and the Python
class exposes no gRPC option to set it back (apache/arrow#40257, #44916), so any peer, authenticated or
not, could make the server buffer a request of any size (1 GiB cost 2.5 GB of RSS). ``grpcio`` takes
``grpc.max_receive_message_length``: a request over ``MAX_REQUEST_BYTES`` is refused by gRPC from its
5-byte length prefix, before its body is buffered (docs/security.md). Any Flight client (pyarrow's) reads
the replies: the messages below are the fields of Flight.proto they use, on protobuf's wire format.

- ``Ticket {bytes ticket = 1}``, ``Action {string type = 1; bytes body = 2}``: decoded by :func:`fields`;
- ``FlightData {bytes data_header = 2; bytes app_metadata = 3; bytes data_body = 1000}``: an Arrow IPC message
  (its flatbuffer header and its body) per reply record batch, the schema first (:func:`flight_data`);
- ``Result {bytes body = 1}``, ``ActionType {string type = 1; string description = 2}``: :func:`message`.
"""
from __future__ import annotations

import struct

import pyarrow as pa

from .protocol import MAX_TICKET_BYTES, ProtocolError

SERVICE = "arrow.flight.protocol.FlightService"
# Flight's verbs and their gRPC shapes: (request streamed, reply streamed)
VERBS = {"Handshake": (True, True), "ListFlights": (False, True), "GetFlightInfo": (False, False),
         "PollFlightInfo": (False, False), "GetSchema": (False, False), "DoGet": (False, True),
         "DoPut": (True, True), "DoExchange": (True, True), "DoAction": (False, True), "ListActions": (False, True)}
MAX_REQUEST_BYTES = 2 * MAX_TICKET_BYTES  # gRPC refuses a larger request message unread (a ticket, an action)

_LEN, _VARINT = 2, 0  # protobuf wire types


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _key(number: int) -> bytes:
    return varint(number << 3 | _LEN)


def message(**numbered: bytes) -> bytes:
    """A message of length-delimited fields, given as ``f<number>=bytes`` (in that order)."""
    return b"".join(_key(int(k[1:])) + varint(len(v)) + v for k, v in numbered.items())


def fields(data: bytes, what: str) -> dict[int, bytes]:
    """The length-delimited fields of a protobuf message (the last of a repeated number wins, as protobuf
    does; varints skipped); anything malformed is a one-line ``ProtocolError`` naming ``what``."""
    out, i, n = {}, 0, len(data)
    try:
        while i < n:
            key, i = _read_varint(data, i)
            if key & 7 == _LEN:
                size, i = _read_varint(data, i)
                if i + size > n:
                    raise ValueError
                out[key >> 3] = data[i:i + size]
                i += size
            elif key & 7 == _VARINT:
                _, i = _read_varint(data, i)
            else:
                raise ValueError
    except (ValueError, IndexError):
        raise ProtocolError(f"bad request: the {what} is not a Flight {what} message") from None
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError


def flight_data(ipc: pa.Buffer, app_metadata: bytes | None = None) -> bytes:
    """A ``FlightData`` of one encapsulated Arrow IPC message (``Schema.serialize()`` or
    ``RecordBatch.serialize()``: continuation marker, int32 header length, flatbuffer header, body)."""
    view = memoryview(ipc)
    (size,) = struct.unpack_from("<i", view, 4)
    header, body = view[8:8 + size], view[8 + size:]
    parts = [_key(2), varint(len(header)), header]
    if app_metadata is not None:
        parts += [_key(3), varint(len(app_metadata)), app_metadata]
    if len(body):
        parts += [_key(1000), varint(len(body)), body]
    return b"".join(parts)
