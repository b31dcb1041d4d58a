"""Copy rows from memory-mapped shards into one batch buffer, a whole batch per call.

The rows of a shuffled batch come from as many shards as it has rows, so numpy can vectorise
nothing: a Python loop of one copy per row costs more than the copies. This kernel takes each
row's source address instead (shard mapping + row offset, computed by numpy for the whole
batch) and copies, widening on the way when the buffer's dtype is wider than the shards'
(uint16 -> int64 in one pass, no temporary).

The addresses are only valid while the shards are pinned: the cache never closes a pinned
shard's mapping, and the loader unpins only after this call returns. Every row is bounds-checked
inside the kernel against its shard's rows ``[start, end)`` before it is read (one comparison
per row), so no address, however computed, reads outside a mapping.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from gristmill.errors import GristmillError
from gristmill.jit import cached_njit


class RowOutOfBoundsError(GristmillError):
    """A row address handed to the gather lies outside its shard's rows: a bug, refused before the read."""


@intrinsic
def _pointer(typingctx, address, like):
    """An integer address as a pointer to ``like``'s element type (numba has no cast for it)."""
    sig = types.CPointer(like.dtype)(address, like)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


# Cached on disk: the first call in a fresh environment compiles (about a second); later processes
# load it (gristmill.jit: without a writable cache dir every process compiles).
@cached_njit(nogil=True)
def _gather(out, sources, starts, ends, like):
    width = out.shape[1]
    row_bytes = width * like.itemsize
    for j in range(out.shape[0]):
        a, lo, hi = sources[j], starts[j], ends[j]
        if lo == 0 or a < lo or a + row_bytes > hi or (a - lo) % row_bytes != 0:
            return j  # before any byte of the row is read
        row, dst = numba.carray(_pointer(a, like), width), out[j]
        for i in range(width):  # an explicit loop vectorises; `dst[:] = row` compiles to a 3x slower copy
            dst[i] = row[i]
    return -1


def gather_rows(out: np.ndarray, sources: np.ndarray, starts: np.ndarray, ends: np.ndarray, like: np.ndarray) -> None:
    """``out[j] = the row of out.shape[1] elements of like.dtype at address sources[j]`` (cast to out.dtype).

    ``out``: C-contiguous ``(n, width)``; ``sources``, ``starts``, ``ends``: int64 ``(n,)``, row ``j``'s
    address and the ``[start, end)`` addresses of its shard's rows (it must lie inside, on a row
    boundary); ``like``: any array of the shards' dtype (only its type is used).
    """
    n = out.shape[0]
    if not (out.ndim == 2 and out.flags.c_contiguous and out.flags.writeable and like.ndim == 2
            and all(a.dtype == np.int64 and a.shape == (n,) for a in (sources, starts, ends))):
        raise ValueError(f"gather_rows: out must be a writable C-contiguous 2-D array and sources/starts/ends int64 "
                         f"({n},); got out {out.shape} {out.dtype}, sources {sources.shape} {sources.dtype}")
    bad = _gather(out, sources, starts, ends, like)
    if bad >= 0:
        raise RowOutOfBoundsError(
            f"gather: row {bad} of the batch at address {int(sources[bad]):#x} is not a row of {out.shape[1]} "
            f"{like.dtype} tokens inside its shard's rows [{int(starts[bad]):#x}, {int(ends[bad]):#x}); nothing was read")
