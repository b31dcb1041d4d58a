"""The checks a resume makes before and after loading a checkpoint: same data (or an allowed,
recorded change), same global batch, same model shape, and a DCP state that agrees with meta.json."""
from __future__ import annotations

import logging
from dataclasses import asdict

from .config import TrainConfig
from .errors import ManifestMismatchError, TrainingError
from .checkpoint import compare_states
from .model import KERNEL_FIELDS
from .state import TrainState

log = logging.getLogger("gristmill.trainer")


def check_resume(meta: dict, path: str, pub, cfg: TrainConfig, allow_manifest_change: bool) -> list[dict]:
    """Refuse a checkpoint trained on other data or another global batch; return the manifest-change
    record (with a new entry when the user explicitly allowed a change)."""
    changes = list(meta.get("manifest_changes", []))
    old, new = meta["data"]["manifest_sha256"], pub.manifest.sha256
    if old != new:
        if not allow_manifest_change:
            raise ManifestMismatchError(
                f"checkpoint {path} was trained on manifest {old} ({meta['data']['manifest_url']}), but "
                f"data.manifest {pub.url} has sha256 {new}; pass --allow-manifest-change (or set "
                f"checkpoint.allow_manifest_change: true) to continue on different data, which is recorded in meta.json")
        changes.append({"step": meta["step"], "from_sha256": old, "from_url": meta["data"]["manifest_url"],
                        "to_sha256": new, "to_url": pub.url})
        log.warning("continuing checkpoint %s on a different manifest (%s -> %s), as explicitly allowed", path, old, new)
    if meta["global_batch"] != cfg.data.global_batch:
        raise TrainingError(f"checkpoint {path} was trained with data.global_batch={meta['global_batch']}, the job says "
                            f"{cfg.data.global_batch}; the sample order (step s = samples [s*B, (s+1)*B)) needs the same B")
    return changes


def check_model_args(meta: dict, path: str, args) -> None:
    """The checkpoint's weights must fit the model the job builds (the attention kernel may differ)."""
    ours = {k: v for k, v in asdict(args).items() if k not in KERNEL_FIELDS}
    theirs = {k: v for k, v in meta["model_args"].items() if k not in KERNEL_FIELDS}
    diff = {k: (theirs.get(k), v) for k, v in ours.items() if theirs.get(k) != v}
    if diff:
        detail = ", ".join(f"{k}: checkpoint {a!r} vs job {b!r}" for k, (a, b) in sorted(diff.items()))
        raise TrainingError(f"checkpoint {path} holds a different model shape ({detail}); vocab_size and "
                            f"max_seq_len come from the data manifest")


def check_states_match_meta(meta: dict, path: str, train_state: TrainState, loader_state: dict | None) -> None:
    """The step and loader position restored from the DCP state must be meta.json's: the check
    verify runs too (trainer.checkpoint.compare_states), here on the states as loaded."""
    compare_states(meta, path, train_state.step, loader_state)
