"""Training batches as a pure function of (manifest, seed, global index), from a local NVMe cache.

    from loader import Loader
    for batch in Loader(url, seed=0, global_batch=32, rank=r, world_size=w):
        batch["input_ids"], batch["labels"], batch["indices"], batch["step"]

See docs/loader.md. ``loader.order`` is the pure order function the audit shares.
"""
from .cache import CacheFullError, ShardCache, ShardFetchError
from .loader import CacheTooSmallError, Loader
from .order import ORDERS, Order, sample_at, samples_at

__all__ = ["ORDERS", "CacheFullError", "CacheTooSmallError", "Loader", "Order", "ShardCache", "ShardFetchError",
           "sample_at", "samples_at"]
