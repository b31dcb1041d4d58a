"""Which checkpoints trained on given documents, and at which steps (`gristmill takedown --runs`).

For every committed checkpoint of every run named, the same answer as `audit doc`, for a set of
documents at once: the checkpoint's consumed samples (audit.consumed: the loader's own order,
past rewinds, less bad steps; per component for a mixture) joined by row key with the spans of
those documents in the document index of the data that checkpoint trained on (read with a
``doc_id`` predicate). Document ids are stable across versions of a dataset, so a checkpoint of an
earlier version is answered from its own index. A checkpoint whose data cannot be opened is listed
with the error, never skipped silently.
"""
from __future__ import annotations

import os

import numpy as np

from gristmill.errors import GristmillError
from gristmill.trainer.meta import META_FILE, STEP_DIR

from .checkpoint import open_manifest, read_checkpoint
from .consumed import consumed
from .seen import read_spans, row_offsets


def checkpoint_dirs(path: str) -> list[str]:
    """Every checkpoint of a run directory (oldest first), or the one checkpoint ``path`` is."""
    if os.path.isfile(os.path.join(path, META_FILE)):
        return [os.path.abspath(path)]
    root = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
    found = sorted((int(m.group(1)), os.path.join(root, d)) for d in (os.listdir(root) if os.path.isdir(root) else [])
                   if (m := STEP_DIR.match(d)) and os.path.isfile(os.path.join(root, d, META_FILE)))
    return [os.path.abspath(p) for _, p in found]


def _steps_holding(published, used, doc_ids: list[str]) -> dict[str, list[int]]:
    spans = read_spans(published, columns=["shard", "row", "doc_id"], filters=[("doc_id", "in", doc_ids)])
    if spans.num_rows == 0 or len(used) == 0:
        return {}
    offsets = row_offsets(published.manifest)
    keys = offsets[spans.column("shard").to_numpy()] + spans.column("row").to_numpy()
    order = np.argsort(keys)
    keys, docs = keys[order], np.asarray(spans.column("doc_id").to_pylist(), dtype=object)[order]
    used_keys = offsets[used.shard] + used.row
    hit = np.isin(used_keys, keys)
    out: dict[str, set] = {}
    for k, step in zip(used_keys[hit].tolist(), used.step[hit].tolist()):
        lo, hi = np.searchsorted(keys, k, "left"), np.searchsorted(keys, k, "right")
        for d in docs[lo:hi]:
            out.setdefault(d, set()).add(int(step))
    return {d: sorted(s) for d, s in sorted(out.items())}


def exposure(runs: list[str], doc_ids: list[str]) -> list[dict]:
    """One entry per checkpoint: path, step, data trained on, and per document the steps that trained on it
    (a mixture's documents keyed ``<component>/<doc_id>``, as everywhere in the audit)."""
    from gristmill.manifests.mixture import is_mixture

    from .mixture import consumed_components

    out = []
    for run in runs:
        dirs = checkpoint_dirs(run)
        if not dirs:
            out.append({"run": run, "checkpoint": None, "error": f"no checkpoint under {run}"})
        for path in dirs:
            entry = {"run": run, "checkpoint": path}
            try:
                ckpt = read_checkpoint(path)
                published = open_manifest(ckpt)
                steps = (ckpt.first_step, ckpt.step)
                entry.update(step=ckpt.step, manifest_sha256=ckpt.manifest_sha256, manifest_url=ckpt.manifest_url)
                if steps[1] < steps[0]:
                    found = {}
                elif is_mixture(published):
                    found = {}
                    for comp, pub, used in zip(published.manifest.components, published.components,
                                               consumed_components(published, ckpt, steps)):
                        found.update({f"{comp.name}/{d}": st for d, st in _steps_holding(pub, used, doc_ids).items()})
                else:
                    found = _steps_holding(published, consumed(published.manifest, ckpt, steps), doc_ids)
                entry["documents"] = found
            except GristmillError as e:
                entry["error"] = str(e)
            out.append(entry)
    return out
