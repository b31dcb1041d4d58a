"""The Loader: training batches as a pure function of (manifest, seed, global index).

Step ``s`` of a run with global batch ``B`` covers global indices ``[s*B, (s+1)*B)``; rank ``r``
of ``W`` takes the contiguous slice ``[s*B + r*B/W, s*B + (r+1)*B/W)``. Which row an index
reads is :mod:`loader.order`'s business; this module only fetches, caches and gathers. No
timing, thread count or history enters a batch, so the whole resume state is one integer.

Threads: ``fetch_workers`` threads download shards, ``workers`` threads assemble batches;
both run ``prefetch`` steps ahead of the consumer (the future order is known exactly). The
consumer takes finished batches strictly in step order. ``workers=0`` assembles in the
consumer's thread (downloads still run ahead): the fastest on a CPU-bound box, where a
hand-off between threads costs more than it saves.

A batch is one contiguous ``(B/W, seq_len + 1)`` buffer, ``tokens``, in ``token_dtype``;
``input_ids`` and ``labels`` are views of it. Torch tensors, or numpy arrays with ``Batches(numpy=True)``
(the server's: torch is imported only by a loader that makes tensors, loader/tensors.py). The rows are copied into it by one numba call
(loader/gather.py) from addresses inside the pinned shards' mappings.
"""
from __future__ import annotations

import collections
import logging
import numbers
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from gristmill.manifests import EditedManifestError, HashMismatchError, ManifestDecodeError, Published
from gristmill.manifests.mixture import PublishedMixture, is_mixture, load_data

from .cache import ShardCache
from .documents import document_boundaries
from .errors import CacheTooSmallError
from .gather import gather_rows
from .mixture import MixtureOrder
from .options import INT64, Batches, Caching, Sampling, Source, Threads
from .order import Order
from .tensors import torch
from gristmill.errors import UsageError

log = logging.getLogger(__name__)

PLAN_CHUNK_STEPS = 256  # steps located per vectorised call to the order (amortises numpy call overhead)
MAPPED_CHECK_STEPS = 2  # steps between two checks of the mapped pages (the overshoot is what 2 steps map)


def default_cache_dir() -> str:
    return os.environ.get("GRISTMILL_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "gristmill", "shards"))


class _Step:
    """One rank's share of one step: its global indices, the cache entries (shards) it pins, and
    for each row its entry and its byte offset inside that shard's rows."""

    __slots__ = ("start", "indices", "entries", "row_entries", "offsets")

    def __init__(self, start: int, indices: np.ndarray, entries: np.ndarray, row_entries: np.ndarray,
                 offsets: np.ndarray):
        self.start, self.indices, self.entries, self.row_entries, self.offsets = (
            start, indices, entries, row_entries, offsets)


PLAN_ROWS = 1 << 14  # rows Loader.rows_at_many plans in one call (~48 bytes of plan a row)


def plan_steps(order: Order, starts: np.ndarray, offset: int, size: int, entry_of_shard: np.ndarray,
               row_bytes: int) -> list[_Step]:
    """Locate the rows of many steps in one vectorised call; ``entry_of_shard`` maps a shard's
    position in the manifest to its cache entry."""
    idx = starts[:, None] + offset + np.arange(size, dtype=np.int64)
    shards, rows = order.locate(idx)
    row_entries = entry_of_shard[shards]
    ordered = np.sort(row_entries, axis=1)
    first = np.ones(ordered.shape, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    distinct, ends = ordered[first], np.cumsum(first.sum(axis=1)).tolist()
    offsets = rows * row_bytes
    return [_Step(start, idx[k], distinct[a:b], row_entries[k], offsets[k])  # distinct[a:b]: the step's entries
            for k, (start, a, b) in enumerate(zip(starts.tolist(), [0] + ends[:-1], ends))]


def _merged(steps: list[_Step]) -> _Step:
    """Consecutive steps as one: their rows in order, each cache entry once."""
    if len(steps) == 1:
        return steps[0]
    return _Step(steps[0].start, np.concatenate([s.indices for s in steps]),
                 np.unique(np.concatenate([s.entries for s in steps])),
                 np.concatenate([s.row_entries for s in steps]), np.concatenate([s.offsets for s in steps]))


class Loader:
    """Batches of one rank, in step order. ``data``: a dataset or mixture URL, or a loaded
    ``Published`` / ``PublishedMixture``; the sections (loader/options.py) default to a
    single-process run: ``Sampling`` (split, seed, global batch, rank, order, epochs), ``Source``
    (pinned hash, storage options, retries), ``Caching`` (cache dir and limits), ``Threads`` and
    ``Batches`` (token dtype, pinned memory, document boundaries)."""

    def __init__(self, data: str | Published | PublishedMixture, sampling: Sampling = Sampling(), *,
                 source: Source = Source(), caching: Caching = Caching(), threads: Threads = Threads(),
                 batches: Batches = Batches()):
        # the sections checked their own values; the rest of the set-up reads them under short names
        split, seed, order, window_shards, epochs = (sampling.split, sampling.seed, sampling.order,
                                                     sampling.window_shards, sampling.epochs)
        expected_sha256, storage_options, retries, backoff_s = (source.expected_sha256, source.storage_options,
                                                                source.retries, source.backoff_s)
        cache_limit_bytes, prefetch = caching.limit_bytes, threads.prefetch
        self.sampling, self.source, self.caching, self.threads, self.batches = sampling, source, caching, threads, batches
        self.storage_options = dict(storage_options or {})
        if isinstance(data, str):
            self.published = open_data(data, source)
        else:  # a Published dataset or mixture (a mixture's components are loaded here if they are not yet)
            self.published = load_data(data, **self.storage_options)
        if expected_sha256 is not None and self.published.manifest.sha256 != expected_sha256:
            raise HashMismatchError(f"manifest at {self.published.url} (hash pinned by the caller)", expected_sha256,
                                    self.published.manifest.sha256)
        self.manifest = self.published.manifest
        self.split, self.seed, self.order_name = split, int(seed), order
        self.global_batch, self.rank, self.world_size = (int(sampling.global_batch), int(sampling.rank),
                                                         int(sampling.world_size))
        self.local_batch = self.global_batch // self.world_size
        self.window_shards, self.prefetch = int(window_shards), prefetch
        self.workers, self.fetch_workers = threads.workers, threads.fetch_workers
        # A mixture URL works wherever a dataset's does: only the order and the shards' sources differ.
        if is_mixture(self.published):
            self.order = MixtureOrder(self.published, split, self.seed, order, self.window_shards)
            self.shards, sources = self.order.shards, self.published.components
        else:
            self.order = Order(self.manifest, split, self.seed, order, self.window_shards)
            self.shards, sources = self.manifest.shards, (self.published,)
        self.num_samples = self.order.num_samples  # rows per epoch (a mixture: its length, None if endless)
        self.stop_index = self.order.stop_index(epochs)
        stored = np.dtype(self.manifest.token_dtype)
        self.numpy = batches.numpy
        if self.numpy:  # numpy arrays: torch is not imported (the server's loaders)
            self._torch, self.pin_memory = None, False
            self.token_dtype = self._buf_dtype = _numpy_token_dtype(batches.token_dtype, stored)
        else:
            self._torch = torch()
            self.pin_memory = (self._torch.cuda.is_available() if batches.pin_memory is None
                               else bool(batches.pin_memory))
            self.token_dtype = _torch_token_dtype(self._torch, batches.token_dtype, stored)
            self._buf_dtype = self._torch.empty(0, dtype=self.token_dtype).numpy().dtype
        self._row_like = np.empty((0, self.manifest.row_tokens), stored)  # tells the gather kernel the shards' dtype
        self._row_bytes = self.manifest.row_tokens * stored.itemsize  # a stored row: the planner's row offsets
        self._steps_since_check = 0
        self.next_index = int(sampling.start_index)
        self.last_metrics: dict = {}
        self._generation = 0  # bumped by load_state_dict: a running iterator restarts from the new index
        self._live: set = set()  # iterators started and not finished
        if source.service:  # the batches come from `gristmill serve` (loader/service/client.py): no cache here
            from .service.client import ServiceBatches

            self.remote, self.cache, self.documents = ServiceBatches(self), None, None
            return
        self.remote = None
        self.cache_dir = caching.dir or default_cache_dir()
        self.cache_limit_bytes = cache_limit_bytes
        if cache_limit_bytes is not None:
            need = self.required_cache_bytes()
            if cache_limit_bytes < need:
                raise CacheTooSmallError(
                    f"cache_limit_bytes={cache_limit_bytes:,} is too small for order={order!r}"
                    + (f" (window_shards={self.window_shards})" if order == "window" else "")
                    + f" with prefetch={prefetch} and {self.local_batch} samples per rank per step: up to "
                    f"{self.shards_in_flight()} shards ({need:,} bytes) are needed at once; raise the limit, "
                    + {"global": "use order='window', ", "window": "use fewer window_shards, "}.get(order, "")
                    + "or lower prefetch")
        self.cache = ShardCache(self.cache_dir, sources, storage_options=self.storage_options,
                                limit_bytes=cache_limit_bytes, retries=retries, backoff_s=backoff_s,
                                max_open=max(64, self.shards_in_flight()),
                                mapped_limit_bytes=caching.mapped_limit_bytes)
        self._entry_of_shard = self.cache.ids(self.shards)
        self._shard_of_entry = {int(e): s for e, s in zip(self._entry_of_shard, self.shards)}
        # documents=True: each batch also carries the rows' document boundaries (loader/documents.py;
        # a mixture's from each row's own component).
        self.documents = document_boundaries(self.published, self.storage_options) if batches.documents else None
        self._plans: dict[int, _Step] = {}
        self._fetch_pool: ThreadPoolExecutor | None = None
        self._assemble_pool: ThreadPoolExecutor | None = None
        self._ensure_locks: dict[int, threading.Lock] = {}  # a cache entry's: one ensure of it at a time
        self._ensure_locks_lock = threading.Lock()

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"next_index": self.next_index, "seed": self.seed, "manifest_sha256": self.manifest.sha256,
                "order": self.order_name, "global_batch": self.global_batch, "window_shards": self.window_shards,
                "split": self.split}

    def load_state_dict(self, sd: dict) -> None:
        """Resume at ``sd["next_index"]``. The global batch and world size may differ (elastic)."""
        mine = self.state_dict()
        keys = ("manifest_sha256", "seed", "order", "split") + (("window_shards",) if self.order_name == "window" else ())
        for key in keys:
            if key in sd and sd[key] != mine[key]:
                raise UsageError(f"loader state: {key} is {sd[key]!r} in the saved state but {mine[key]!r} in this "
                                 f"loader; resuming would serve a different sample order")
        if not isinstance(sd.get("next_index"), numbers.Integral) or sd["next_index"] < 0:
            raise UsageError(f"loader state: next_index must be a non-negative int, got {sd.get('next_index')!r}")
        self.next_index = int(sd["next_index"])
        self._generation += 1

    def end_at(self, index: int | None) -> None:
        """End iteration before global ``index`` (a run's end: its last step's; None: the epochs' end, or none),
        or at the epochs' end if sooner. Neither the pipeline nor a served client, which asks for ranges of steps
        ahead, fetches a step past it."""
        ends = [i for i in (self.order.stop_index(self.sampling.epochs), index) if i is not None]
        self.stop_index = min(ends) if ends else None

    # -- sizing ----------------------------------------------------------------------------
    def shards_in_flight(self) -> int:
        """Upper bound on the distinct shards the ``prefetch`` steps in flight touch at once."""
        shards = self.order.shard_ids.size
        samples = self.prefetch * self.local_batch
        span = (self.prefetch - 1) * self.global_batch + self.local_batch  # global indices they spread over
        min_rows = int(self.order.rows[self.order.rows > 0].min())
        streams = self.order.streams  # a mixture's components each read their own windows
        if self.order_name == "global":
            return min(shards, samples)
        if self.order_name == "window":  # a window holds >= 1 shard, so >= min_rows rows
            return min(shards, samples, streams * self.window_shards * (-(-span // min_rows) + 1))
        return min(shards, samples, streams * (-(-span // min_rows) + 1))

    def required_cache_bytes(self) -> int:
        sizes = sorted((self.shards[i].raw_bytes for i in self.order.shard_ids), reverse=True)
        return sum(sizes[: self.shards_in_flight()])

    # -- planning ----------------------------------------------------------------------------
    def _plan(self, start: int) -> _Step:
        """The step whose global batch starts at ``start``; located in vectorised chunks."""
        if start not in self._plans:
            starts = start + self.global_batch * np.arange(PLAN_CHUNK_STEPS, dtype=np.int64)
            steps = plan_steps(self.order, starts, self.rank * self.local_batch, self.local_batch, self._entry_of_shard,
                               self._row_bytes)
            self._plans = {s.start: s for s in steps}
        return self._plans[start]

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self):
        while True:
            generation = self._generation
            pipeline = _Pipeline(self, self.next_index) if self.remote is None else self.remote.pipeline(self.next_index)
            self._live.add(pipeline)
            try:
                while generation == self._generation:
                    if self.stop_index is not None and self.next_index + self.global_batch > self.stop_index:
                        return
                    t0 = time.perf_counter()
                    batch, metrics = pipeline.next()
                    self._bound_mapped_pages()
                    metrics["input_wait_s"] = time.perf_counter() - t0
                    metrics["page_releases"] = self.page_releases
                    self.next_index += self.global_batch
                    self.last_metrics = metrics
                    yield batch
            finally:
                pipeline.close()
                self._live.discard(pipeline)

    @property
    def page_releases(self) -> int:
        return 0 if self.cache is None else self.cache.page_releases

    def _bound_mapped_pages(self) -> None:
        """Every MAPPED_CHECK_STEPS steps, the cache releases its mapped pages past the limit."""
        if self.cache is None:  # served: no shard is mapped here
            return
        self._steps_since_check += 1
        if self._steps_since_check >= MAPPED_CHECK_STEPS:
            self._steps_since_check = 0
            self.cache.bound_mapped_pages()

    def _pools(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        if self._fetch_pool is None:
            self._fetch_pool = ThreadPoolExecutor(self.fetch_workers, thread_name_prefix="gristmill-fetch")
            if self.workers:  # workers=0: batches are assembled in the consumer's thread
                self._assemble_pool = ThreadPoolExecutor(self.workers, thread_name_prefix="gristmill-batch")
        return self._fetch_pool, self._assemble_pool

    def close(self) -> None:
        """Stop the background threads and release the cache (an abandoned iterator included)."""
        for pipeline in list(self._live):
            pipeline.close()
        self._live.clear()
        if self.remote is not None:
            self.remote.close()
            return
        for pool in (self._fetch_pool, self._assemble_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._fetch_pool = self._assemble_pool = None
        self.cache.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- assembly (runs in a worker thread) --------------------------------------------------
    def rows_at_many(self, starts, size: int, steps_at_once: int = 1):
        """The batches of global indices ``[start, start + size)`` for each of ``starts`` in turn, as a
        generator, fetched and assembled in the calling thread: rank ``r``'s share of step ``s`` for any
        (global batch ``B``, world size ``W``) starts at ``s*B + r*B/W`` and has ``B/W`` rows.
        ``steps_at_once``: each batch holds the rows of that many consecutive starts (the last one fewer),
        in order, ``size`` rows each: one pin, fetch and gather for them all (the server's per-step cost,
        amortised; it slices the rows back into steps). Thread-safe, and independent of this loader's
        own sampling's batch, rank and position. The rows of all of them are located in one vectorised
        ``plan_steps`` call, each batch fetched and assembled when it is asked for (one in memory at a
        time). What ``gristmill serve`` answers a request with (loader/service/server.py). The plan is
        made ``PLAN_ROWS`` rows at a time (whole batches), so a request of 2^20 rows holds ~1 MB of plan,
        not ~50 MB."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        group = max(1, steps_at_once)
        chunk = max(1, PLAN_ROWS // max(size * group, 1)) * group
        for a in range(0, starts.size, chunk):
            plan = plan_steps(self.order, starts[a:a + chunk], 0, size, self._entry_of_shard, self._row_bytes)
            for k in range(0, len(plan), group):
                step = _merged(plan[k:k + group])
                plan[k:k + group] = [None] * len(plan[k:k + group])  # each step's plan is freed once it is assembled
                yield self._assemble(step, self._ensure(step))
            del plan

    def _ensure(self, step: _Step) -> list[tuple[Future, bool]]:
        """Pin a step's entries and fetch its shards in this thread. One ensure of an entry at a time (what
        the pipeline's in-flight table does for its callers); ensures of different entries run at once, so
        a stream waiting on a cold shard does not hold up the streams reading others."""
        fetches = []
        try:
            for entry in self.cache.pin_ids(step.entries).tolist():
                with self._ensure_lock(entry):
                    done: Future = Future()
                    done.set_result(self.cache.ensure(self._shard_of_entry[entry]))
                fetches.append((done, True))
        except BaseException:
            self.cache.unpin_ids(step.entries)
            raise
        return fetches

    def _ensure_lock(self, entry: int) -> threading.Lock:
        with self._ensure_locks_lock:
            lock = self._ensure_locks.get(entry)
            if lock is None:
                lock = self._ensure_locks[entry] = threading.Lock()
            return lock

    def new_batch(self, indices: np.ndarray, step: int) -> tuple[dict, np.ndarray]:
        """The batch of the rows at global ``indices``, its tokens not yet filled in, and the numpy view of
        its ``(rows, seq_len + 1)`` ``tokens`` (``token_dtype``; pinned with ``pin_memory``) to copy them
        into: here, and in the service client. Inputs and labels are views of the one buffer: no copy, and
        one transfer to the GPU. With ``numpy`` the batch's arrays are numpy's (no torch)."""
        shape, t = (indices.size, self._row_like.shape[1]), self._torch
        if self.pin_memory:
            tokens = t.empty(shape, dtype=self.token_dtype, pin_memory=True)
            buf = tokens.numpy()
        else:  # the cheaper way to the same tensor
            buf = np.empty(shape, self._buf_dtype)
            tokens = buf if t is None else t.from_numpy(buf)
        indices = indices.copy()
        return {"tokens": tokens, "input_ids": tokens[:, :-1], "labels": tokens[:, 1:],
                "indices": indices if t is None else t.from_numpy(indices), "step": step}, buf

    def _assemble(self, step: _Step, fetches: list[tuple[Future, bool]]) -> tuple[dict, dict]:
        batch, buf = self.new_batch(step.indices, step.start // self.global_batch)
        try:
            misses = downloaded = 0
            for fut, started_here in fetches:
                n = fut.result().downloaded_bytes
                if started_here and n > 0:
                    misses, downloaded = misses + 1, downloaded + n
            starts, ends = self.cache.bounds(step.row_entries)
            gather_rows(buf, starts + step.offsets, starts, ends, self._row_like)
        finally:
            self.cache.unpin_ids(step.entries)
        if self.documents is not None:
            batch.update(self.documents.batch(*self.order.locate(step.indices), self.numpy))
        return batch, {"step": batch["step"], "cache_hits": step.entries.size - misses, "cache_misses": misses,
                       "bytes_downloaded": downloaded}


class _Pipeline:
    """Steps in flight for one pass of iteration: ``prefetch`` of them, consumed in order."""

    def __init__(self, loader: Loader, start: int):
        self.ld, self.next_submit = loader, start
        self.fetch_pool, self.assemble_pool = loader._pools()
        self.pending: collections.deque[tuple[_Step, Future]] = collections.deque()
        self.inflight: dict[str, Future] = {}  # raw_sha256 -> download in progress
        self._fill()

    def _fill(self) -> None:
        ld = self.ld
        while len(self.pending) < ld.prefetch:
            if ld.stop_index is not None and self.next_submit + ld.global_batch > ld.stop_index:
                return
            step = ld._plan(self.next_submit)
            fetches = []  # (future, started by this step) for each shard not ready yet
            for entry in ld.cache.pin_ids(step.entries).tolist():
                shard = ld._shard_of_entry[entry]
                fut = self.inflight.get(shard.raw_sha256)
                started_here = fut is None or fut.done()
                if started_here:
                    fut = self.fetch_pool.submit(ld.cache.ensure, shard)
                    self.inflight[shard.raw_sha256] = fut
                fetches.append((fut, started_here))
            job = _Inline(ld._assemble, step, fetches) if self.assemble_pool is None else \
                self.assemble_pool.submit(ld._assemble, step, fetches)
            self.pending.append((step, job))
            self.next_submit += ld.global_batch
        for key in [k for k, f in self.inflight.items() if f.done()]:
            del self.inflight[key]

    def next(self) -> tuple[dict, dict]:
        _, fut = self.pending.popleft()
        out = fut.result()  # an error surfaces now, without planning (and fetching) more steps
        self._fill()  # at most `prefetch` steps pinned at once: what the cache-limit check assumes
        return out

    def close(self) -> None:
        for step, fut in self.pending:
            if fut.cancel():  # never ran: its pins are still held
                self.ld.cache.unpin_ids(step.entries)
            else:
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - the consumer has stopped; its error is moot
                    pass
        self.pending.clear()


class _Inline:
    """A deferred call with the two Future methods the pipeline uses (workers=0)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def result(self):
        return self.fn(*self.args)

    def cancel(self) -> bool:
        return True


def _torch_token_dtype(tm, want, stored: np.dtype):
    """The batches' torch dtype (``tm``: the torch module): the stored one (``want`` None), or ``want`` if it
    holds the stored tokens."""
    stored_torch = tm.from_numpy(np.empty(0, stored)).dtype
    t = stored_torch if want is None else tm.int64 if want == INT64 else want
    wider_int = t.is_signed and not (t.is_floating_point or t.is_complex) and t.itemsize > stored.itemsize
    _check(t == stored_torch or wider_int,
           f"token_dtype {t} cannot hold the shards' {stored} tokens; use None (the stored dtype) or torch.int64")
    return t


def _numpy_token_dtype(want, stored: np.dtype) -> np.dtype:
    """The batches' numpy dtype (``Batches(numpy=True)``): the stored one, or a wider signed integer."""
    try:
        t = stored if want is None else np.dtype(want)
    except TypeError:
        raise UsageError(f"token_dtype {want} is not a numpy dtype (Batches(numpy=True) makes numpy arrays); "
                         f"use None (the stored dtype) or 'int64'") from None
    _check(t == stored or (t.kind == "i" and t.itemsize > stored.itemsize),
           f"token_dtype {t} cannot hold the shards' {stored} tokens; use None (the stored dtype) or 'int64'")
    return t


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def open_data(data: str, source: Source = Source()) -> Published | PublishedMixture:
    """The dataset version or mixture ``data`` names: a URL read from its store (with ``source``'s
    retries), or, with ``source.service`` set, a bare name or manifest sha256 that the service resolves
    (loader/service/client.py ``served_data``: the client needs no store access; every hash is checked)."""
    if source.service and "/" not in data and ":" not in data:
        from .service.client import served_data

        return served_data(data, source)
    return _load_with_retries(data, source.expected_sha256, dict(source.storage_options or {}), source.retries,
                              source.backoff_s)


def _load_with_retries(url: str, expected_sha256, storage_options: dict, retries: int,
                       backoff_s: float) -> Published | PublishedMixture:
    """Read the manifest, retrying what a flaky remote does to a read: an I/O error, bytes that do not
    decode (not UTF-8 / JSON) or that do not hash to the sha256 they record (a byte flipped in transit).
    A manifest that reads back valid but is refused (a wrong pinned hash, a bad field) is final."""
    for attempt in range(retries):
        try:
            return load_data(url, expected_sha256=expected_sha256, **storage_options)
        except (OSError, ManifestDecodeError, EditedManifestError) as e:
            if attempt + 1 == retries:
                if isinstance(e, ManifestDecodeError):
                    raise ManifestDecodeError(
                        f"{e} (the same in all {retries} reads): the stored manifest.json is damaged; restore it, or "
                        f"republish the version") from e
                raise
            log.warning("reading manifest %s failed (%s); retrying", url, e)
            time.sleep(min(backoff_s * 2 ** attempt, 10.0))
    raise AssertionError("unreachable")
