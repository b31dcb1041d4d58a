"""torch, imported on first use: the loader's batches are torch tensors, but ``gristmill serve`` moves numpy
rows (``Batches(numpy=True)``) and must start without torch (issue 41: a server image without it, RSS at start
<= 150 MB). ``torch()`` caches the module, so a call per batch costs a global lookup, not an import."""
from __future__ import annotations

_torch = None


def torch():
    """The torch module (imported by the first call)."""
    global _torch
    if _torch is None:
        import torch as module

        _torch = module
    return _torch
