"""The loader's errors: ``CacheError`` (the local shard cache cannot serve a shard) and its family."""
from __future__ import annotations

from gristmill.errors import GristmillError


class CacheError(GristmillError):
    """The local shard cache cannot serve a shard: a fetch that kept failing, or no room."""


class ShardFetchError(CacheError):
    """A shard could not be fetched and verified after every retry."""


class CacheFullError(CacheError):
    """No unpinned shard is left to evict and the limit would be exceeded."""


class CacheTooSmallError(CacheError):
    """cache_limit_bytes cannot hold the shards the chosen order needs at once."""
