"""``<run_dir>/samples.jsonl`` (``run.log_samples``): the global sample indices of every step."""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from gristmill.manifests.storage import atomic_write


class SampleLog:
    """With ``run.log_samples``, rank 0 writes ``<run_dir>/samples.jsonl``: one line per optimizer
    step with the global sample indices the ranks' batches carried, in rank order (one all-gather
    per step: a first-hand record for the audit to be checked against; the indices themselves
    follow from the checkpoint's loader state). On resume, lines after the checkpoint's step are
    dropped (those steps' weights were discarded with the crash), so the file always describes
    the lineage of the newest model."""

    def __init__(self, run_dir: str, *, enabled: bool, writer: bool, world_size: int, resume_step: int):
        self.path = os.path.join(run_dir, "samples.jsonl")
        self.enabled, self.writer, self.world_size = enabled, writer, world_size
        if enabled and writer:
            self._truncate_after(resume_step)

    def _truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        atomic_write(self.path, "".join(keep).encode())

    def append(self, step: int, local_indices: torch.Tensor, device) -> None:
        """Collective when enabled: every rank calls it every step."""
        if not self.enabled:
            return
        local = local_indices.to(device)
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        if self.writer:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "indices": torch.cat(parts).tolist()}) + "\n")
