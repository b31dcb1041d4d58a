"""The validation loss: the first ``eval.batches`` batches of the validation split, the same every time."""
from __future__ import annotations

import torch
import torch.distributed as dist

from gristmill.loader import Batches, Caching, Loader, Sampling, Source, Threads

from .config import TrainConfig
from .errors import TrainingError
from .model import position_ids
from .step import cross_entropy, inputs_and_labels


@torch.no_grad()
def evaluate(model, cfg: TrainConfig, pub, d, source: Source = Source()) -> float:
    """Mean loss over the first ``eval.batches`` batches of the validation split (same batches every time);
    ``source``: the training loader's (its service endpoints, when it has them)."""
    B = cfg.eval.global_batch or cfg.data.global_batch
    if B % d.world_size:
        raise TrainingError(f"eval.global_batch={B} does not divide by the world size {d.world_size}")
    # the run's loaded data (a dataset or a mixture with its components): no manifest is read again
    val = Loader(pub, Sampling(split="validation", seed=cfg.data.seed, global_batch=B, rank=d.rank,
                               world_size=d.world_size, order="sequential"),
                 source=source, caching=Caching(dir=cfg.data.cache_dir), threads=Threads(prefetch=cfg.data.prefetch),
                 batches=Batches(token_dtype=None, documents=cfg.model.document_mask))
    model.eval()
    total = torch.zeros((), device=d.device)
    n = 0
    for batch in val:
        inputs, labels = inputs_and_labels(batch, d.device)
        total += cross_entropy(model(inputs, position_ids(batch, d.device, 1)[0]), labels)
        n += 1
        if n == cfg.eval.batches:
            break
    val.close()
    model.train()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.item() / max(n, 1) / d.world_size
