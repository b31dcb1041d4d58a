"""The key-value store a restarted process group may use: a namespace of its own in torchrun's
store, agreed by the ranks of this restart round alone.

Why (torch 2.13, measured here and read in its source): torchrun's agent hosts one TCPStore for
its workers (``TORCHELASTIC_USE_AGENT_STORE=True``, MASTER_ADDR:MASTER_PORT) and keeps that same
server across restart rounds: the static rendezvous creates it once (``StaticTCPRendezvous``),
the c10d one caches it (``DynamicRendezvousHandler._shared_tcp_store_server`` and
``_bootstrap_store_info``). ``torch.distributed.rendezvous._create_c10d_store`` hands workers that
store without a per-round prefix ("We create a new TCPStore for every retry", no longer true), so
a restarted round's ``init_process_group`` writes and reads the keys the killed round left: gloo
then dials the dead round's peer addresses (``gloo ... failed to connect ... remote=[127.0.0.1]:PORT``)
or waits on keys that will never change (pytorch#135712; the fix there, a new server per round,
did not survive). ``TORCHELASTIC_RESTART_COUNT`` cannot name the round either: each agent counts
its own restarts, and an agent restarted by another node's failure does not count it.

So the ranks agree on a fresh namespace through the store itself. Every process takes a ticket
(``store.add``: unique over the store's whole life). Rank 0 publishes its ticket as the leader;
every other rank reads the leader, says hello in the leader's namespace under its own ticket and
waits for rank 0's acknowledgement of that ticket. An acknowledgement can only come from a live
rank 0 (a ticket is never reused, so no stale key answers it); a rank that read a dead round's
leader hears nothing, reads the leader again and follows the new one. Every worker of the
previous round is gone before a round starts (torchrun stops its workers before it joins the
next round), so nothing of theirs reads or writes the new namespace.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta

import torch.distributed as dist

from .errors import TrainingError

PREFIX = "gristmill"
RETRY_S = 1.0  # a follower's wait for an acknowledgement before it reads the leader again
POLL_S = 0.02


def uses_agent_store() -> bool:
    """Under torchrun with the agent-hosted store (its default since torch 2.4)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def agent_store(timeout: timedelta) -> dist.Store:
    """A client of torchrun's store at MASTER_ADDR:MASTER_PORT (the agent is its server)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timeout, wait_for_workers=False)


def round_store(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> dist.PrefixStore:
    """``store`` under a namespace that only this round's ranks use (see the module's docstring)."""
    ticket = store.add(f"{PREFIX}/tickets", 1)
    deadline = time.monotonic() + timeout.total_seconds()
    if rank == 0:
        namespace = f"{PREFIX}/round-{ticket}"
        store.set(f"{PREFIX}/leader", str(ticket))
        _acknowledge(store, namespace, world_size, deadline)
    else:
        namespace = _follow(store, rank, ticket, deadline)
    return dist.PrefixStore(namespace + "/", store)


def _acknowledge(store: dist.Store, namespace: str, world_size: int, deadline: float) -> None:
    waiting = set(range(1, world_size))
    while waiting:
        for r in sorted(waiting):
            if store.check([f"{namespace}/hello/{r}"]):
                store.set(f"{namespace}/ack/{store.get(f'{namespace}/hello/{r}').decode()}", "1")
                waiting.discard(r)
        if waiting:
            _wait_or_fail(deadline, f"ranks {sorted(waiting)} did not join rank 0")
            time.sleep(POLL_S)


def _follow(store: dist.Store, rank: int, ticket: int, deadline: float) -> str:
    while True:
        namespace = f"{PREFIX}/round-{store.get(f'{PREFIX}/leader').decode()}"
        store.set(f"{namespace}/hello/{rank}", str(ticket))
        try:
            store.wait([f"{namespace}/ack/{ticket}"], timedelta(seconds=RETRY_S))
            return namespace
        except dist.DistStoreError:  # no live rank 0 behind this leader (yet): read it again
            _wait_or_fail(deadline, f"rank {rank} heard no rank 0 of this round")


def _wait_or_fail(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TrainingError(f"process group rendezvous: {what} within run.hang_timeout_s; "
                            f"check that every node started and reaches MASTER_ADDR:MASTER_PORT")
