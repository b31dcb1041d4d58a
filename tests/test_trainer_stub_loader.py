"""A stand-in for ``loader.Loader`` with the same API (docs/architecture.md), used by the trainer
tests so they exercise the trainer alone: the real loader has its own tests. Order: a seeded
permutation per epoch (``global``/``window``) or manifest order (``sequential``); step s covers
global indices [s*B, (s+1)*B) and rank r takes its contiguous slice, as the contract says."""
from __future__ import annotations

import os

import numpy as np
import torch

from manifests import load_manifest, read_rows


class StubLoader:
    def __init__(self, manifest_url, split="train", seed=0, global_batch=32, rank=0, world_size=1, order="global",
                 cache_dir=None, prefetch=4, expected_sha256=None, cache_limit_bytes=None):
        pub = load_manifest(manifest_url, expected_sha256=expected_sha256)
        self.rows = np.concatenate([read_rows(os.path.join(pub.url, s.path), expected_sha256=s.sha256)
                                    for s in pub.manifest.shards_of(split)]).astype(np.int64)
        self.sha256, self.seed, self.order, self.B = pub.manifest.sha256, seed, order, global_batch
        self.rank, self.world_size = rank, world_size
        self.next_index = 0
        self.last_metrics = {"input_wait_s": 0.0, "cache_hits": 0, "cache_misses": 0, "bytes_downloaded": 0}

    def _rows_of(self, indices: np.ndarray) -> np.ndarray:
        n = len(self.rows)
        if self.order == "sequential":
            return indices % n
        epochs, pos = indices // n, indices % n
        return np.array([np.random.default_rng([self.seed, e]).permutation(n)[p] for e, p in zip(epochs, pos)])

    def __iter__(self):
        local = self.B // self.world_size
        while True:
            start = self.next_index + self.rank * local
            indices = np.arange(start, start + local)
            rows = torch.from_numpy(self.rows[self._rows_of(indices)])
            step = self.next_index // self.B
            self.next_index += self.B
            yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:], "indices": torch.from_numpy(indices), "step": step}

    def state_dict(self):
        return {"next_index": self.next_index, "seed": self.seed, "manifest_sha256": self.sha256, "order": self.order,
                "global_batch": self.B}

    def load_state_dict(self, sd):
        if sd["manifest_sha256"] != self.sha256:
            raise ValueError("loader state is for another manifest")
        self.next_index = sd["next_index"]


def test_stub_loader_slices_the_global_batch_by_rank(toy_dataset):
    full = next(iter(StubLoader(toy_dataset.url, global_batch=8)))
    halves = [next(iter(StubLoader(toy_dataset.url, global_batch=8, rank=r, world_size=2))) for r in (0, 1)]
    assert torch.equal(torch.cat([h["input_ids"] for h in halves]), full["input_ids"])
    assert full["indices"].tolist() == list(range(8))
