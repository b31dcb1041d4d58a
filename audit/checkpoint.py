"""What the audit needs from a checkpoint: the data position and the manifest it was trained on.

Everything comes from ``meta.json`` (the trainer's checkpoint metadata, see docs/trainer.md):
the loader state (next global index, seed, order, split), the global batch and world size,
and the data manifest's hash and URL. The manifest is then loaded and its hash compared with
the checkpoint's: an audit against any other data would be an answer about the wrong data.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from gristmill.manifests import ManifestError, ManifestNotFoundError, Published, load_manifest
from gristmill.errors import GristmillError

META_FILE = "meta.json"
FORMAT = "gristmill-checkpoint-v1"  # trainer/checkpoint.py (not imported: it pulls in torch)
_STEP_DIR = re.compile(r"^step-(\d+)$")


class AuditError(GristmillError):
    """The checkpoint and the data do not fit together, or the question cannot be answered."""


@dataclass(frozen=True)
class Checkpoint:
    """Optimizer step n (1-based, as in step-<N>/, metrics.jsonl, samples.jsonl) consumed global
    sample indices [(n-1)*B, n*B); checkpoint step-<N> holds the model after samples [0, N*B)."""

    path: str  # the checkpoint directory
    step: int  # optimizer steps completed
    world_size: int
    global_batch: int
    next_index: int  # the next global sample index the loader would serve
    seed: int
    order: str  # the loader's order: global, window or sequential
    split: str
    window_shards: int | None  # the "window" order's window (None: the loader's default)
    manifest_sha256: str
    manifest_url: str
    manifest_changes: tuple[dict, ...]  # resumes onto another manifest, explicitly allowed (trainer)
    world_sizes: tuple[tuple[int, int | None], ...]  # (last step, world size) per segment of the run; None: unknown
    meta: dict

    @property
    def first_step(self) -> int:
        """The first step trained on this manifest (later than 1 if a resume switched manifests)."""
        return 1 + max((int(c["step"]) for c in self.manifest_changes), default=0)


def find_checkpoint(path: str) -> str:
    """A checkpoint directory from a step dir, its meta.json, or a run dir (newest checkpoint)."""
    path = os.path.abspath(path)
    if os.path.basename(path) == META_FILE:
        return os.path.dirname(path)
    if os.path.isfile(os.path.join(path, META_FILE)):
        return path
    for ckpts in (os.path.join(path, "checkpoints"), path):
        steps = [(int(m.group(1)), d) for d in (os.listdir(ckpts) if os.path.isdir(ckpts) else [])
                 if (m := _STEP_DIR.match(d)) and os.path.isfile(os.path.join(ckpts, d, META_FILE))]
        if steps:
            return os.path.join(ckpts, max(steps)[1])
    raise FileNotFoundError(f"no checkpoint at {path}: expected a step-<N>/ directory holding {META_FILE}, "
                            f"or a run directory with checkpoints/step-<N>/{META_FILE}")


def _get(meta: dict, dotted: str, where: str):
    value = meta
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise AuditError(f"{where}: missing field {dotted!r}")
        value = value[key]
    return value


def read_checkpoint(path: str) -> Checkpoint:
    """Parse a checkpoint's meta.json (layout: docs/trainer.md); every missing or inconsistent field is named."""
    ckpt_dir = find_checkpoint(path)
    meta_path = os.path.join(ckpt_dir, META_FILE)
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except json.JSONDecodeError as e:
        raise AuditError(f"{meta_path}: not valid JSON: {e}") from e
    if meta.get("format") != FORMAT:
        raise AuditError(f"{meta_path}: format is {meta.get('format')!r}, expected {FORMAT!r}")
    loader = _get(meta, "loader", meta_path)
    ckpt = Checkpoint(
        path=ckpt_dir,
        step=int(_get(meta, "step", meta_path)),
        world_size=int(_get(meta, "world_size", meta_path)),
        global_batch=int(_get(meta, "global_batch", meta_path)),
        next_index=int(_get(meta, "loader.next_index", meta_path)),
        seed=int(_get(meta, "loader.seed", meta_path)),
        order=str(loader.get("order", "global")),
        split=str(loader.get("split") or meta.get("data", {}).get("split", "train")),
        window_shards=int(loader["window_shards"]) if loader.get("window_shards") is not None else None,
        manifest_sha256=str(_get(meta, "data.manifest_sha256", meta_path)),
        manifest_url=str(_get(meta, "data.manifest_url", meta_path)),
        manifest_changes=tuple(meta.get("manifest_changes") or ()),
        world_sizes=world_size_segments(ckpt_dir, meta),
        meta=meta,
    )
    _check_consistent(ckpt, loader, meta_path)
    return ckpt


def world_size_segments(ckpt_dir: str, meta: dict) -> tuple[tuple[int, int | None], ...]:
    """(last step, world size) of each segment of the run, oldest first, from the ``resumed_from`` chain.

    A resume may change the world size (the loader's order does not depend on it, but the
    rank slices do). Each checkpoint records the one it resumed from; that checkpoint's
    meta.json gives the world size up to its step. When it has been pruned, the world size of
    the steps before it is unknown (None) rather than guessed.
    """
    segments = [(int(meta["step"]), int(meta["world_size"]))]
    while meta.get("resumed_from"):
        # Same checkpoints/ directory, even if the run directory was moved since.
        prev = os.path.join(os.path.dirname(ckpt_dir), os.path.basename(str(meta["resumed_from"]).rstrip("/")))
        step = _STEP_DIR.match(os.path.basename(prev))
        try:
            with open(os.path.join(prev, META_FILE)) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            if step:
                segments.append((int(step.group(1)), None))
            break
        segments.append((int(meta["step"]), int(meta["world_size"])))
        ckpt_dir = prev
    return tuple(reversed(segments))


def _check_consistent(ckpt: Checkpoint, loader: dict, where: str) -> None:
    """Fields recorded twice must agree: a hand-edited meta.json must not give a confident answer."""
    B, W = ckpt.global_batch, ckpt.world_size
    if B <= 0 or W <= 0 or B % W:
        raise AuditError(f"{where}: global_batch {B} is not a positive multiple of world_size {W}")
    if ckpt.next_index != ckpt.step * B:
        raise AuditError(f"{where}: loader.next_index {ckpt.next_index} is not step {ckpt.step} x global_batch {B} "
                         f"= {ckpt.step * B}; optimizer step n consumes samples [(n-1)*B, n*B)")
    if loader.get("global_batch", B) != B:
        raise AuditError(f"{where}: loader.global_batch {loader['global_batch']} differs from global_batch {B}")
    if "manifest_sha256" in loader and loader["manifest_sha256"] != ckpt.manifest_sha256:
        raise AuditError(f"{where}: loader.manifest_sha256 {loader['manifest_sha256']} differs from "
                         f"data.manifest_sha256 {ckpt.manifest_sha256}")
    job = ckpt.meta.get("job", {}).get("data", {})
    for key, value in (("seed", ckpt.seed), ("order", ckpt.order), ("global_batch", B)):
        if key in job and job[key] != value:
            where_from = "global_batch" if key == "global_batch" else f"loader.{key}"
            raise AuditError(f"{where}: {where_from} {value!r} differs from the job config's data.{key} {job[key]!r}")


def open_manifest(ckpt: Checkpoint, manifest_url: str | None = None) -> Published:
    """Load the manifest the checkpoint names (or one moved to ``manifest_url``) and insist on its hash.

    ``load_manifest`` already refuses a manifest whose content no longer matches its recorded
    hash; here the hash must also equal the one the checkpoint trained on.
    """
    url = manifest_url or ckpt.manifest_url
    try:
        published = load_manifest(url)
    except ManifestNotFoundError as e:
        raise AuditError(f"{e}; checkpoint {ckpt.path} was trained on manifest {ckpt.manifest_sha256} at "
                         f"{ckpt.manifest_url}: if that version moved, pass its new location with --manifest") from e
    actual = published.manifest.sha256
    if actual != ckpt.manifest_sha256:
        raise AuditError(
            f"manifest at {published.url} has sha256 {actual}, but checkpoint {ckpt.path} was trained on "
            f"{ckpt.manifest_sha256}; refusing to audit against different data"
        )
    return published


def verify_files(ckpt: Checkpoint) -> None:
    """The trainer's own check that the checkpoint's files match meta.json (imports torch)."""
    from gristmill.trainer.checkpoint import verify

    problems = verify(ckpt.path)
    if problems:
        raise AuditError(f"checkpoint {ckpt.path} does not verify: " + "; ".join(problems[:5]))
