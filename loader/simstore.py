"""A simulated remote object store for tests and ``gristmill loader bench``.

``gmsim:///abs/path`` serves the local file ``/abs/path`` as a remote store would: every read
request waits ``latency_s`` plus ``size / bandwidth_bps``, and a fraction ``fail_rate`` of
read requests fail with an OSError (``corrupt_rate``: return the bytes with one byte flipped).
It is a real fsspec filesystem, so the loader reads it through the same code path as
``s3://`` or ``https://``; options travel as ``storage_options``.

Importing this module (or the loader) registers nothing: ``gristmill loader bench`` and the
tests that want ``gmsim://`` call :func:`register` first, so a production process never has a
fault-injecting filesystem behind one of its URL schemes.
"""
from __future__ import annotations

import io
import random
import threading
import time

import fsspec
from fsspec.implementations.local import LocalFileSystem

from gristmill.manifests.storage import join_url

PROTOCOL = "gmsim"


class SimulatedStore(LocalFileSystem):
    protocol = (PROTOCOL,)

    def __init__(self, latency_s: float = 0.0, bandwidth_bps: float | None = None, fail_rate: float = 0.0,
                 corrupt_rate: float = 0.0, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if not (0 <= fail_rate < 1 and 0 <= corrupt_rate < 1):
            raise ValueError(f"fail_rate and corrupt_rate must be in [0, 1), got {fail_rate}, {corrupt_rate}")
        self.latency_s, self.bandwidth_bps = float(latency_s), bandwidth_bps
        self.fail_rate, self.corrupt_rate = float(fail_rate), float(corrupt_rate)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        # fsspec caches one instance per option set, so these count every loader using those options.
        self.requests = self.failures = self.corruptions = 0

    def _roll(self) -> float:
        with self._lock:
            return self._rng.random()

    def info(self, path, **kwargs):
        time.sleep(self.latency_s)  # a metadata request (HEAD) costs a round trip too
        return super().info(path, **kwargs)

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        if "r" not in mode:
            return super()._open(path, mode=mode, block_size=block_size, **kwargs)
        with self._lock:
            self.requests += 1
        time.sleep(self.latency_s)
        if self._roll() < self.fail_rate:
            with self._lock:
                self.failures += 1
            raise OSError(f"{PROTOCOL}: simulated failure reading {path}")
        with super()._open(path, mode="rb") as f:
            data = f.read()
        if self.bandwidth_bps:
            time.sleep(len(data) / self.bandwidth_bps)
        if data and self._roll() < self.corrupt_rate:
            with self._lock:
                self.corruptions += 1
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
            data = bytes(data)
        return io.BytesIO(data)


def register() -> None:
    """Make ``gmsim://`` URLs resolve to :class:`SimulatedStore` in this process (idempotent)."""
    fsspec.register_implementation(PROTOCOL, SimulatedStore, clobber=True)


def simulated_url(local_path: str) -> str:
    """The gmsim:// URL serving a local path."""
    return join_url(PROTOCOL, local_path)
