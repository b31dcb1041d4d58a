"""What a stream of ``gristmill serve`` may cost, and who pays: admission by streams and reply bytes, globally and
per client identity, and the cancelling of streams nobody reads.

A stream holds a gRPC thread and up to one assembled chunk of reply bytes (server.py ``ASSEMBLE_BYTES``) until
its reader has taken it; those are what bound the server, not the number of addresses. A client's identity
is the id it sends (``gristmill-client``, with its token: a pod's hostname by default) or its TLS peer, else its
address, so the ranks of one host share a bound and two pods behind one NAT do not.

A stream past a bound waits up to ``wait_s`` for room (streams are short: a range of steps read at network
speed), and only then is refused as busy; the client backs off and asks again until its deadline, so a
refusal costs a client time, never its run. :class:`Idle` cancels a stream whose reader has taken nothing
for ``idle_s`` (its slot and bytes come back), so unread streams cannot hold a host's share for ever.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

log = logging.getLogger(__name__)


class Busy(Exception):
    """No room within the wait: one line naming the bound, for the client's retry log."""


class Admission:
    """Streams and reply bytes in flight, bounded in all and per identity; :meth:`enter` waits for room."""

    def __init__(self, streams: int, nbytes: int, client_streams: int, client_bytes: int, wait_s: float):
        self.bounds = {"streams": streams, "bytes": nbytes, "client_streams": client_streams, "client_bytes": client_bytes}
        self.wait_s = wait_s
        self.cond = threading.Condition()
        self.streams = self.nbytes = 0
        self.by_client: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])  # identity -> [streams, bytes]

    @property
    def active(self) -> int:
        return self.streams

    def cost(self, nbytes: int) -> int:
        """What a stream of chunks of ``nbytes`` reserves: at most a client's bound, so one big step is served alone."""
        return min(nbytes, self.bounds["client_bytes"], self.bounds["bytes"])

    def enter(self, client: str, nbytes: int) -> None:
        """Reserve a stream of ``cost(nbytes)`` for ``client``, waiting up to ``wait_s`` for room; else :class:`Busy`."""
        deadline = time.monotonic() + self.wait_s
        with self.cond:
            while (full := self._full(client, nbytes)) is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(f"gristmill serve: busy ({full}); retry later or use another endpoint")
                self.cond.wait(left)
            mine = self.by_client[client]
            mine[0] += 1
            mine[1] += nbytes
            self.streams += 1
            self.nbytes += nbytes

    def leave(self, client: str, nbytes: int) -> None:
        with self.cond:
            mine = self.by_client[client]
            mine[0] -= 1
            mine[1] -= nbytes
            if not mine[0]:
                del self.by_client[client]
            self.streams -= 1
            self.nbytes -= nbytes
            self.cond.notify_all()

    def _full(self, client: str, nbytes: int) -> str | None:
        b, mine = self.bounds, self.by_client.get(client, (0, 0))
        if self.streams + 1 > b["streams"]:
            return f"{b['streams']} streams in all, --max-streams"
        if self.nbytes + nbytes > b["bytes"]:
            return f"{b['bytes']} reply bytes in flight in all, --max-inflight-bytes"
        if mine[0] + 1 > b["client_streams"]:
            return f"{client} has {b['client_streams']} streams open, --max-streams-per-client"
        if mine[1] + nbytes > b["client_bytes"]:
            return f"{client} has {b['client_bytes']} reply bytes in flight, --max-inflight-bytes-per-client"
        return None


class Idle:
    """Streams whose reader has taken nothing for ``idle_s``, cancelled by a daemon thread (``on_cancel`` counts
    and logs). A stream is idle only while it waits on its reader, not while the server assembles its steps."""

    def __init__(self, idle_s: float, on_cancel):
        self.idle_s, self.on_cancel = idle_s, on_cancel
        self.lock = threading.Lock()
        self.streams: dict[int, tuple] = {}  # id -> (stream, gRPC context)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gristmill-serve-idle", daemon=True)
        self._thread.start()

    def add(self, stream, context) -> None:
        with self.lock:
            self.streams[id(stream)] = (stream, context)

    def remove(self, stream) -> None:
        with self.lock:
            self.streams.pop(id(stream), None)

    def sweep(self) -> None:
        now = time.monotonic()
        with self.lock:
            idle = [(s, c) for s, c in self.streams.values() if s.waiting_since is not None and now - s.waiting_since >= self.idle_s]
            for s, _ in idle:
                del self.streams[id(s)]
        for stream, context in idle:
            context.cancel()  # wakes the gRPC thread blocked in the send; the stream's callback frees its slot
            self.on_cancel(stream)

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.idle_s / 4)):
            self.sweep()

    def close(self) -> None:
        self._stop.set()
