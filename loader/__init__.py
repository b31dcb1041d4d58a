"""Training batches as a pure function of (manifest, seed, global index), from a local NVMe cache.

    from gristmill.loader import Loader, Sampling
    for batch in Loader(url, Sampling(seed=0, global_batch=32, rank=r, world_size=w)):
        batch["tokens"], batch["input_ids"], batch["labels"], batch["indices"], batch["step"]

See docs/loader.md. ``loader.order`` is the pure order function the audit shares.
"""
import importlib

# Lazy: the audit imports only `loader.order` and should not pay for torch.
_EXPORTS = {
    "CacheError": "errors", "CacheFullError": "errors", "ShardFetchError": "errors", "CacheTooSmallError": "errors",
    "ShardCache": "cache", "Loader": "loader", "open_data": "loader", "DocumentBoundaries": "documents",
    "Batches": "options", "Caching": "options", "Sampling": "options", "Source": "options", "Threads": "options",
    "MixtureBoundaries": "documents",
    "GristmillDataset": "torch_dataset",
    "ORDERS": "order", "Order": "order", "sample_at": "order", "samples_at": "order",
}


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loader' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = ["ORDERS", "Batches", "CacheError", "CacheFullError", "Caching", "CacheTooSmallError", "DocumentBoundaries", "GristmillDataset", "Loader",
           "MixtureBoundaries", "Order", "Sampling", "ShardCache", "ShardFetchError",
           "Source", "Threads", "open_data", "sample_at", "samples_at"]
