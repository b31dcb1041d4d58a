"""Copy rows from memory-mapped shards into one batch buffer, a whole batch per call.

The rows of a shuffled batch come from as many shards as it has rows, so numpy can vectorise
nothing: a Python loop of one copy per row costs more than the copies. This kernel takes each
row's source address instead (shard mapping + row offset, computed by numpy for the whole
batch) and copies, widening on the way when the buffer's dtype is wider than the shards'
(uint16 -> int64 in one pass, no temporary).

The addresses are only valid while the shards are pinned: the cache never closes a pinned
shard's mapping, and the loader unpins only after this call returns.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic


@intrinsic
def _pointer(typingctx, address, like):
    """An integer address as a pointer to ``like``'s element type (numba has no cast for it)."""
    sig = types.CPointer(like.dtype)(address, like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


# cache=True: the first call in a fresh environment compiles (about a second); later processes load it.
@numba.njit(nogil=True, cache=True)
def _gather(out, sources, like):
    width = out.shape[1]
    for j in range(out.shape[0]):
        row, dst = numba.carray(_pointer(sources[j], like), width), out[j]
        for i in range(width):  # an explicit loop vectorises; `dst[:] = row` compiles to a 3x slower copy
            dst[i] = row[i]


def gather_rows(out: np.ndarray, sources: np.ndarray, like: np.ndarray) -> None:
    """``out[j] = the row of out.shape[1] elements of like.dtype at address sources[j]`` (cast to out.dtype).

    ``out``: C-contiguous ``(n, width)``; ``sources``: int64 ``(n,)``; ``like``: any array of the
    shards' dtype (only its type is used).
    """
    _gather(out, sources, like)
