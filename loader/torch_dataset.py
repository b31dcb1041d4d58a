"""``GristmillDataset``: the Loader as a ``torch.utils.data.IterableDataset`` with exact resume.

    ds = GristmillDataset(url, batch_size=8, seed=0, rank=r, world_size=w)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)   # or torchdata's StatefulDataLoader

Every item is one step's batch for this rank, exactly what ``Loader`` yields (``tokens``,
``input_ids``, ``labels``, ``indices``, ``step``, and with ``documents=True`` the document
boundaries): the i-th item of the DataLoader is the Loader's i-th step, whatever ``num_workers``.

Worker shares: a DataLoader over an IterableDataset takes its items round-robin from its
workers (item i from worker ``i mod k``, in order). So worker ``w`` of ``k`` serves steps
``w, w + k, w + 2k, ...`` of the run (counted from where the iterator started): one Loader per
worker whose "global batch" is ``k`` steps and whose "rank" is ``w * world_size + rank``. The
shares are disjoint and deterministic, and the interleave reproduces the single-process order.

State (the torchdata ``StatefulDataLoader`` convention: ``state_dict()`` / ``load_state_dict()``
on the dataset, called in the main process with ``num_workers=0`` and inside each worker
otherwise):

- the dataset's own state, ``{"next_index", ...}``: the global sample index the next item starts
  at (``Loader.state_dict``'s form, the trainer checkpoint's ``loader`` field). Load it before
  creating the DataLoader iterator to resume a plain ``DataLoader`` at any worker count.
- a worker's state adds ``"worker"`` and ``"num_workers"``: where that worker's next round starts.
  StatefulDataLoader saves one per worker and hands each back to its worker on resume (it refuses a
  different worker count itself; so does this class).
"""
from __future__ import annotations

import numbers

import torch
from torch.utils.data import IterableDataset, get_worker_info

from gristmill.errors import UsageError

from .loader import Loader
from .options import sections

IDENTITY_KEYS = ("manifest_sha256", "seed", "order", "split")


class GristmillDataset(IterableDataset):
    """An IterableDataset over ``Loader(manifest_url, ...)``; ``batch_size`` is this rank's rows per item.

    ``loader_options`` go to each worker's Loader (``cache_dir``, ``order``, ``documents``,
    ``token_dtype``, ``expected_sha256``, ``storage_options``, ...). ``epochs``: None = endless.
    """

    def __init__(self, manifest_url: str, *, batch_size: int = 8, seed: int = 0, rank: int = 0, world_size: int = 1,
                 split: str = "train", epochs: int | None = None, start_index: int = 0, **loader_options):
        for name in ("global_batch", "start_index", "workers", "pin_memory", "epochs"):
            if name in loader_options:
                raise UsageError(f"GristmillDataset: {name} is set by the dataset (use batch_size, start_index, epochs; "
                                 f"pin memory with DataLoader(pin_memory=True))")
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise UsageError(f"GristmillDataset: batch_size must be >= 1 and 0 <= rank < world_size, got "
                             f"batch_size={batch_size}, rank={rank}, world_size={world_size}")
        self.url, self.batch_size, self.seed, self.rank, self.world_size = manifest_url, batch_size, seed, rank, world_size
        self.split, self.epochs, self.loader_options = split, epochs, loader_options
        self.global_batch = batch_size * world_size  # samples per step over all ranks
        # Checked once here, so a bad URL or pinned hash fails before any worker starts; the probe
        # also says where the data ends (epochs of a dataset, a finite mixture's end), or None.
        with self._loader(global_batch=self.global_batch, rank=rank, world_size=world_size, epochs=epochs,
                          documents=False) as probe:
            self._identity = {k: probe.state_dict()[k] for k in IDENTITY_KEYS}
            self._stop = probe.stop_index
        self.next_index = int(start_index)
        self._worker_state: dict | None = None  # set in a worker by StatefulDataLoader

    def _loader(self, **kw) -> Loader:
        # the DataLoader's workers are the parallelism; ``kw`` wins (the probe reads no document index)
        options = {"workers": 0, "pin_memory": False, **self.loader_options, **kw}
        return Loader(self.url, **sections(split=self.split, seed=self.seed, **options))

    # -- iteration -------------------------------------------------------------------------
    def __iter__(self):
        info = get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        state = self._worker_state
        if state is not None and state["num_workers"] != k:
            raise UsageError(f"GristmillDataset: a worker state saved with {state['num_workers']} workers cannot resume "
                             f"with {k}; load the dataset state ({{'next_index': ...}}) instead")
        base = self.next_index if state is None else state["next_index"]  # where this worker's next round starts
        G = self.global_batch
        with self._loader(global_batch=k * G, rank=w * self.world_size + self.rank, world_size=k * self.world_size,
                          start_index=base) as ld:
            if self._stop is not None:
                # The worker's Loader ends a round only where its own G samples end: the rounds past
                # this worker's slot (workers w+1..k-1) may run past the end without it reading them.
                ld.stop_index = self._stop + (k - 1 - w) * G
            for batch in ld:
                start = base + w * G  # this item's step starts here
                if self._stop is not None and start + G > self._stop:
                    return
                batch["step"] = start // G
                base += k * G
                if info is None:
                    self.next_index = base
                else:
                    self._worker_state = {"next_index": base, "worker": w, "num_workers": k, **self._identity}
                yield batch

    # -- state (torchdata Stateful) ---------------------------------------------------------
    def state_dict(self) -> dict:
        if self._worker_state is not None:
            return dict(self._worker_state)
        info = get_worker_info()
        if info is not None:  # a worker asked before its first item: its round starts where the dataset does
            return {"next_index": self.next_index, "worker": info.id, "num_workers": info.num_workers, **self._identity}
        return {"next_index": self.next_index, "global_batch": self.global_batch, **self._identity}

    def load_state_dict(self, sd: dict) -> None:
        for key in IDENTITY_KEYS:
            if key in sd and sd[key] != self._identity[key]:
                raise UsageError(f"GristmillDataset state: {key} is {sd[key]!r} in the saved state but "
                                 f"{self._identity[key]!r} here; resuming would serve a different sample order")
        if not isinstance(sd.get("next_index"), numbers.Integral) or sd["next_index"] < 0:
            raise UsageError(f"GristmillDataset state: next_index must be a non-negative int, got {sd.get('next_index')!r}")
        if "num_workers" in sd:
            info = get_worker_info()
            if info is None or info.id != sd["worker"]:
                raise UsageError("GristmillDataset state: a worker's state loads only into that worker (StatefulDataLoader "
                                 "does this); resume a dataset from {'next_index': ...}")
            self._worker_state = {k: sd[k] for k in ("next_index", "worker", "num_workers")} | self._identity
        else:
            self.next_index, self._worker_state = int(sd["next_index"]), None

