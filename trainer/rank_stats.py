"""Every rank's timings, seen without slowing the step.

Each rank keeps, over the steps since the last train record (the *window*), the sums and maxima
of three times per step: its input wait (blocked on the loader), its step time, and its wait in
the step's first collective. Nothing of it touches the device or another rank between records:
host clocks on CPU, CUDA events on GPU (read only at the record). At a record, one all-gather of
a small tensor (``WindowStats.VALUES`` floats per rank, the stop signal included) brings every
rank's window to every rank, and rank 0 writes the per-rank lists.

The collective wait. With FSDP2 the first collective of a step is the all-gather of the token
embeddings' shards in the first forward: a rank that reaches it early waits there for the last
one. Two forward pre-hooks around FSDP's own (one before it, one after it) time that wait:
on CPU the host time from arriving at the all-gather to its end; on GPU the time between two
CUDA events on the compute stream, which stalls until the all-gather is done (the all-gather's own
transfer is included). The waits in backward's reduce-scatters are not measured: by then the
ranks are in step again, and a rank's lateness has already shown at the first collective.

A straggler is a rank whose own time per step (step time less the collective wait: the part
that is not waiting for others) exceeds the median rank's by more than ``run.straggler_fraction``,
in ``run.straggler_windows`` windows in a row.
"""
from __future__ import annotations

import socket
import statistics
import time

import torch
import torch.distributed as dist


class FirstCollectiveWait:
    """Times the wait in each step's first FSDP all-gather (see the module's docstring)."""

    def __init__(self, module: torch.nn.Module, device: torch.device):
        self.cuda = device.type == "cuda"
        self.armed = False
        self.t0 = 0.0
        self.events: tuple | None = None
        self.host_s = 0.0
        # prepend=True runs before FSDP's pre-forward hook (registered with prepend by fully_shard)
        module.register_forward_pre_hook(self._arrive, prepend=True)
        module.register_forward_pre_hook(self._done)

    def arm(self) -> None:
        self.armed, self.events, self.host_s = True, None, 0.0

    def _arrive(self, module, args) -> None:
        if not self.armed:
            return
        if self.cuda:
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        else:
            self.t0 = time.perf_counter()

    def _done(self, module, args) -> None:
        if not self.armed:
            return
        self.armed = False
        if self.cuda:
            self.events[1].record()
        else:
            self.host_s = time.perf_counter() - self.t0


class WindowStats:
    """This rank's timings since the last record, and the one gather that shares them."""

    VALUES = ("steps", "input_wait_sum", "input_wait_max", "step_sum", "step_max", "collective_wait_sum",
              "collective_wait_max", "signum")

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.first_wait = FirstCollectiveWait(model.tok_embeddings, device)
        self.pending: list[tuple] = []  # per step: (input wait s, host step s, step events, collective wait)
        self.step_events = None
        self.window_t0 = time.perf_counter()

    def begin_step(self) -> None:
        self.first_wait.arm()
        if self.cuda:
            self.step_events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.step_events[0].record()

    def end_step(self, input_wait_s: float, host_step_s: float) -> None:
        if self.cuda:
            self.step_events[1].record()
            collective = self.first_wait.events  # read at the record
        else:
            collective = self.first_wait.host_s
        self.pending.append((input_wait_s, host_step_s, self.step_events, collective))

    def _local(self, signum: int) -> list[float]:
        waits, steps, colls = [], [], []
        for input_wait, host_step, step_events, coll in self.pending:
            waits.append(input_wait)
            if step_events is not None:
                step_events[1].synchronize()
                steps.append(step_events[0].elapsed_time(step_events[1]) / 1000.0)
            else:
                steps.append(host_step)
            if isinstance(coll, tuple):
                coll[1].synchronize()
                coll = coll[0].elapsed_time(coll[1]) / 1000.0
            colls.append(float(coll or 0.0))  # None: no FSDP all-gather ran (no armed forward)
        n = len(self.pending)
        return [n, sum(waits), max(waits, default=0.0), sum(steps), max(steps, default=0.0), sum(colls),
                max(colls, default=0.0), signum]

    def gather(self, world_size: int, signum: int) -> list[dict]:
        """Every rank's window (a dict of VALUES per rank, in rank order); starts the next window.
        Collective: every rank calls it at the same step."""
        local = torch.tensor(self._local(signum), dtype=torch.float64, device=self.device)
        if world_size > 1:
            parts = [torch.empty_like(local) for _ in range(world_size)]
            dist.all_gather(parts, local)
            rows = torch.stack(parts).tolist()
        else:
            rows = [local.tolist()]
        now = time.perf_counter()
        self.wall_s, self.window_t0 = now - self.window_t0, now
        self.pending = []
        return [dict(zip(self.VALUES, row)) for row in rows]


def rank_fields(windows: list[dict]) -> dict:
    """The train record's per-rank lists (means per step over the window; maxima of the window)."""
    def per(key: str) -> list[float]:
        return [w[f"{key}_sum"] / max(1, w["steps"]) for w in windows]

    return {"rank_input_wait_s": per("input_wait"), "rank_step_s": per("step"),
            "rank_collective_wait_s": per("collective_wait"),
            "rank_input_wait_max_s": [w["input_wait_max"] for w in windows],
            "rank_step_max_s": [w["step_max"] for w in windows],
            "window_steps": int(windows[0]["steps"])}


class StragglerRule:
    """Names a rank whose own time per step (step less collective wait) exceeds the median rank's
    by more than ``fraction`` in ``windows`` windows in a row (see the module's docstring)."""

    def __init__(self, fraction: float, windows: int, hosts: list[str]):
        self.fraction, self.windows, self.hosts = fraction, windows, hosts
        self.streak = [0] * len(hosts)

    def update(self, fields: dict) -> list[dict]:
        """The stragglers this window completes (each named once per streak, then every further
        ``windows`` windows while it lasts)."""
        own = [max(0.0, s - c) for s, c in zip(fields["rank_step_s"], fields["rank_collective_wait_s"])]
        median = statistics.median(own)
        found = []
        for rank, t in enumerate(own):
            slow = len(own) > 1 and t > median * (1.0 + self.fraction)
            self.streak[rank] = self.streak[rank] + 1 if slow else 0
            if slow and self.streak[rank] % self.windows == 0:
                found.append({"rank": rank, "host": self.hosts[rank], "own_step_s": t, "median_own_step_s": median,
                              "windows": self.streak[rank], "input_wait_s": fields["rank_input_wait_s"][rank]})
        return found


def gather_hostnames(world_size: int) -> list[str]:
    """Every rank's host name, in rank order (once, at the start: an object gather)."""
    names = [None] * world_size
    if world_size > 1:
        dist.all_gather_object(names, socket.gethostname())
        return names
    return [socket.gethostname()]
