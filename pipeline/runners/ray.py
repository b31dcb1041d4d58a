"""The ``ray`` runner: plain Ray tasks (``runner.kind: ray``, and ``auto`` with a cluster named by
``--address``, ``runner.address`` or RAY_ADDRESS). It owns Ray's start-up and shutdown: it joins
the named cluster, or starts an embedded Ray with only the processes a prepare needs and stops it
at the end; a Ray already initialised in the process (a test session, a notebook) is used as it is."""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Iterator

from gristmill.errors import GristmillError
from gristmill.manifests.storage import split_url

from ..progress import Progress
from ..runner import Runner, TaskFailed, batches_of, run_batch
from ..workdir import WorkDir
from .ray_messages import driver_messages_to_log


logger = logging.getLogger(__name__)  # gristmill.pipeline.runners.ray


class RayStartError(GristmillError):
    """Ray could not be started or joined; the message says which setting helps."""


class RayRunner(Runner):
    """Ray tasks over batches of items (at most MAX_BATCH, several batches per CPU so the load
    spreads), at most ``max_in_flight`` batches at once (default twice the cluster's CPUs). A
    batch whose worker or node dies is retried by Ray up to ``max_retries`` times; an exception
    an item raises is not retried."""

    kind, retries_lost_workers = "ray", True
    options = ("address", "num_cpus", "concurrency", "max_retries", "object_store_mb", "connect_timeout_s")

    @classmethod
    @contextlib.contextmanager
    def start(cls, cfg, wd: WorkDir, progress: Progress | None = None,
              inputs: dict[int, list[str]] | None = None) -> Iterator["RayRunner"]:
        """Ray joined or started (``ray_runtime``) for the run, and shut down after it; Ray's own
        messages to the driver (a lost node's raylet log) go to the run dir's log, not the terminal."""
        with ray_runtime(cfg) as ray, driver_messages_to_log(wd):
            yield cls(ray, wd, progress, max_in_flight=cfg.concurrency, max_retries=cfg.max_retries, inputs=inputs)

    def __init__(self, ray, wd: WorkDir, progress: Progress | None = None, *, max_in_flight: int | None = None,
                 max_retries: int = 3, inputs: dict[int, list[str]] | None = None):
        super().__init__(wd, progress, inputs)
        self.ray, self.max_in_flight, self.max_retries = ray, max_in_flight, max_retries

    def _execute(self, step, todo, fn):
        ray = self.ray
        cpus = max(1, int(ray.available_resources().get("CPU", 1)))
        limit = self.max_in_flight or cpus * 2
        batches = batches_of(todo, limit, self.wd)
        # SPREAD: tasks go to every node of a cluster, not first to fill the driver's node (Ray's
        # default), so a cluster's CPUs and local disks all work; on one machine it changes nothing.
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False,
                            scheduling_strategy="SPREAD")(run_batch)
        fn_ref = ray.put(fn)
        pending: dict = {}
        queue = iter(batches)
        while True:
            while len(pending) < limit and (b := next(queue, None)) is not None:
                pending[remote.remote(fn_ref, b, self.wd, step)] = b
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                batch = pending.pop(ref)
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, TaskFailed):
                        raise cause from None
                    raise self.error(step, batch[0], f"{type(cause or e).__name__}: {cause or e}", None) from None
                except ray.exceptions.RayError as e:  # a worker or node lost more than max_retries times
                    raise self._lost_error(step, batch, self.max_retries + 1, self.max_retries, e) from None
                yield from zip(batch, out)
            if not ready and self.progress is not None:
                self.progress.tick(step)


@contextlib.contextmanager
def ray_runtime(cfg, address: str | None = None):
    """Embedded local Ray by default; ``address`` (or ``cfg.address``, or RAY_ADDRESS, set by `ray
    job submit`) joins a cluster. ``cfg``: the job's ``runner:`` section."""
    import ray

    if ray.is_initialized():  # e.g. the test session's Ray
        yield ray
        return
    address = address or cfg.address
    join = address or os.environ.get("RAY_ADDRESS")
    logger.info("%s", f"joining the Ray cluster at {join}" if join else "starting an embedded Ray")
    try:
        if join:
            _wait_for_cluster(join, cfg.connect_timeout_s)
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            ray.init(**embedded_ray_options(cfg))
    except RayStartError:
        raise
    except Exception as e:  # Ray raises plain Exception/TimeoutError/ConnectionError: the environment, not the job
        with contextlib.suppress(Exception):
            ray.shutdown()  # stop whatever half-started processes it left
        raise RayStartError(_ray_start_advice(e, join, cfg.num_cpus)) from e
    try:
        yield ray
    finally:
        ray.shutdown()


def _wait_for_cluster(address: str, timeout_s: float) -> None:
    """A cluster whose ``host:port`` (``ray://host:port`` too) does not answer a TCP connect within
    ``timeout_s`` fails here in one line: ``ray.init`` retried for minutes without a word. Other
    forms (``auto``: the local cluster's own file) are left to Ray."""
    host, sep, port = split_url(address)[1].rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.5, min(5.0, timeout_s))).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RayStartError(f"cannot join the Ray cluster at {address}: nothing answers there after "
                                    f"{timeout_s:g} s ({e.strerror or e}); check the address and that its head is up "
                                    "(`ray status` on it), or raise runner.connect_timeout_s while it is still "
                                    "starting") from None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def embedded_ray_options(cfg) -> dict:
    """A local Ray with only the processes a prepare needs: no dashboard (nor its agent's HTTP
    server), a small object store (tasks pass items and stats of a few KB, never data), task
    events off, and no worker started before the first task asks for one."""
    return {"num_cpus": cfg.num_cpus, "include_dashboard": False, "log_to_driver": False, "configure_logging": False,
            "object_store_memory": cfg.object_store_mb << 20,
            "_system_config": {"task_events_report_interval_ms": 0, "enable_worker_prestart": False,
                               "prestart_worker_first_driver": False, "enable_metrics_collection": False}}


def _ray_start_advice(e: Exception, join: str | None, num_cpus: int | None) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    cause = f"{type(e).__name__}{': ' + first if first else ''}"
    if join:
        return (f"cannot join the Ray cluster at {join} ({cause}); check that it is up and runs the same Ray and "
                "Python versions (`ray status` on the head), or drop --address / runner.address / RAY_ADDRESS for "
                "an embedded Ray")
    cpus = f"runner.num_cpus: {num_cpus} is set; lower it" if num_cpus else "set runner.num_cpus in the job (e.g. 2)"
    return (f"the embedded Ray did not start ({cause}). On a busy machine give its processes more time: "
            f"RAY_raylet_start_wait_time_s=120 RAY_worker_register_timeout_seconds=120 in the environment; "
            f"{cpus} to start fewer workers; or join a running cluster with --address")
