"""Skipped samples: ranges of global sample indices the run consumed no update from (torch-free).

Two kinds, both recorded in every later checkpoint's ``meta.json`` under ``skips`` (in the data
position, so the DCP state holds a copy too) and honoured by the audit:

- ``rewind``: a loss or gradient-norm spike at step ``step`` made the trainer reload checkpoint
  ``after_step`` and pass over ``[start, end)``: the loader's next index jumped from ``start`` (the
  checkpoint's) to ``end``. Those samples were never trained on by the model that continued, and
  every step after ``after_step`` reads ``end - start`` indices further on.
- ``bad_step``: step ``step`` read ``[start, end)`` but its update was skipped for a non-finite loss
  or gradient norm. The step still counts; the samples trained nothing.

So optimizer step ``n`` (1-based) with global batch ``B`` reads ``[(n-1)*B + shift(n), n*B + shift(n))``
where ``shift(n)`` sums the lengths of the rewinds with ``after_step < n``; the loader's next index
after step ``N`` is ``N*B + shift(N+1)``. Trainer, meta.json validator and audit all use this module.
"""
from __future__ import annotations

import numpy as np

KINDS = ("rewind", "bad_step")


def record(kind: str, start: int, end: int, step: int, reason: str, after_step: int | None = None) -> dict:
    """One skip, as meta.json holds it."""
    return {"kind": kind, "start": int(start), "end": int(end), "step": int(step), "after_step": after_step,
            "reason": reason}


def problem(skips, step: int, global_batch: int) -> str | None:
    """What is wrong with a ``skips`` list of a checkpoint at ``step`` (None: nothing): fields, kinds,
    ranges inside what the loader could have consumed, rewinds in order of their starts."""
    if not isinstance(skips, list):
        return f"skips must be a list, got {type(skips).__name__}"
    last_end = 0
    for i, s in enumerate(skips):
        if not isinstance(s, dict) or s.get("kind") not in KINDS:
            return f"skips[{i}]: expected a record with kind {' or '.join(KINDS)}"
        ints = [s.get(k) for k in ("start", "end", "step")]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or not 0 <= ints[0] < ints[1]:
            return f"skips[{i}]: start, end, step must be integers with 0 <= start < end"
        if s["step"] > step:
            return f"skips[{i}]: step {s['step']} is later than this checkpoint's step {step}"
        if s["kind"] == "bad_step" and s["end"] - s["start"] != global_batch:
            return f"skips[{i}]: a bad step covers one global batch ({global_batch}), not {s['end'] - s['start']}"
        if s["kind"] == "rewind":
            after = s.get("after_step")
            if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after < s["step"]:
                return f"skips[{i}]: a rewind needs after_step, an integer in [0, step)"
            if (s["end"] - s["start"]) % global_batch:
                return f"skips[{i}]: a rewind skips whole steps, a multiple of the global batch {global_batch}"
            if s["start"] < last_end or s["start"] != after * global_batch + shift_before(skips[:i], after + 1):
                return (f"skips[{i}]: a rewind to step {after} starts at that checkpoint's next index "
                        f"{after * global_batch + shift_before(skips[:i], after + 1)}, not {s['start']}")
            last_end = s["end"]
    return None


def rewinds(skips) -> list[dict]:
    return [s for s in skips or () if s["kind"] == "rewind"]


def shift_before(skips, step: int) -> int:
    """Indices passed over by rewinds before step ``step`` (those with ``after_step < step``)."""
    return sum(s["end"] - s["start"] for s in rewinds(skips) if s["after_step"] < step)


def next_index(step: int, global_batch: int, skips) -> int:
    """The loader's next global index after optimizer step ``step``."""
    return step * global_batch + shift_before(skips, step + 1)


def step_indices(first: int, last: int, global_batch: int, skips) -> tuple[np.ndarray, np.ndarray]:
    """(global index, step) of every sample steps ``first..last`` (inclusive) read, in training order."""
    steps = np.arange(first, last + 1, dtype=np.int64)
    shift = np.zeros(len(steps), dtype=np.int64)
    for s in rewinds(skips):
        shift[steps > s["after_step"]] += s["end"] - s["start"]
    starts = (steps - 1) * global_batch + shift
    index = (starts[:, None] + np.arange(global_batch, dtype=np.int64)[None, :]).reshape(-1)
    return index, np.repeat(steps, global_batch)


def bad_step_mask(index: np.ndarray, skips) -> np.ndarray:
    """True where a global index belongs to a step whose update was skipped (bad_step)."""
    mask = np.zeros(len(index), dtype=bool)
    for s in skips or ():
        if s["kind"] == "bad_step":
            mask |= (index >= s["start"]) & (index < s["end"])
    return mask


def skipped_samples(skips, global_batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(global index, step, position in ``skips``) of every skipped sample. ``step`` is the step that
    read it (a bad step), or would have read it (a rewind: after_step + 1 onwards, as before the rewind)."""
    idx, steps, which = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for i, s in enumerate(skips or ()):
        index = np.arange(s["start"], s["end"], dtype=np.int64)
        idx.append(index)
        if s["kind"] == "rewind":
            steps.append(s["after_step"] + 1 + (index - s["start"]) // global_batch)
        else:
            steps.append(np.full(len(index), s["step"], dtype=np.int64))
        which.append(np.full(len(index), i, dtype=np.int64))
    return np.concatenate(idx), np.concatenate(steps), np.concatenate(which)
