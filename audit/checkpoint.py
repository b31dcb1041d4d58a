"""What the audit needs from a checkpoint: the data position and the manifest it was trained on.
The checkpoint may be on a local disk or on any store (``s3://bucket/run/checkpoints/step-<N>``,
or the checkpoint dir for the newest), read through ``manifests.storage.Store``.

Everything comes from ``meta.json``, read and checked by the trainer's own torch-free reader
(trainer/meta.py: format, self-hash, fields recorded twice agree): the loader state (next
global index, seed, order, split), the global batch and world size, and the data manifest's
hash and URL. The manifest is then loaded and its hash compared with the checkpoint's: an
audit against any other data would be an answer about the wrong data. ``verify_files`` adds
the trainer's full check (file hashes, and the data position copy inside the DCP state).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from gristmill.errors import GristmillError
from gristmill.manifests import ManifestNotFoundError, Published
from gristmill.manifests.mixture import PublishedMixture, load_data
from gristmill.manifests.storage import Store, local_path, split_url
from gristmill.trainer.errors import CheckpointError
from gristmill.trainer.meta import LOCAL, META_FILE, STEP_DIR, read_meta


class AuditError(GristmillError):
    """The checkpoint and the data do not fit together, or the question cannot be answered."""


class CheckpointNotFoundError(AuditError, FileNotFoundError):
    """No checkpoint where the command was pointed (a typo, a run without checkpoints yet)."""


@dataclass(frozen=True)
class Checkpoint:
    """Optimizer step n (1-based, as in step-<N>/, metrics.jsonl, samples.jsonl) consumed global
    sample indices [(n-1)*B, n*B) shifted past the rewinds' skips before it; checkpoint step-<N> holds
    the model after samples [0, next_index) less the skipped ones (trainer/skips.py)."""

    path: str  # the checkpoint directory (a URL on an object store)
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
    skips: tuple[dict, ...] = ()  # samples no update came from: rewinds past a spike, bad steps (trainer/skips.py)
    # how its store was opened (credentials, an endpoint): never part of what the checkpoint is
    storage_options: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def first_step(self) -> int:
        """The first step trained on this manifest (later than 1 if a resume switched manifests)."""
        return 1 + max((int(c["step"]) for c in self.manifest_changes), default=0)


def _store(path: str, storage_options: dict | None = None) -> tuple[Store, str]:
    """The store a checkpoint path or URL is on (opened with ``storage_options``), and the path as
    that store names it (local: absolute)."""
    local = local_path(path)
    if local is not None:
        return LOCAL, os.path.abspath(local)
    return Store.from_url(path, **(storage_options or {})), path.rstrip("/")


def _listdir(store: Store, path: str) -> list[str]:
    try:
        return store.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def find_checkpoint(path: str, storage_options: dict | None = None) -> str:
    """A checkpoint directory from a step dir, its meta.json, a run dir or a checkpoint dir (newest
    committed checkpoint), on a local disk or any store (``s3://bucket/run/checkpoints``, opened
    with ``storage_options``)."""
    store, path = _store(path, storage_options)
    if os.path.basename(path) == META_FILE:
        return os.path.dirname(path)
    if store.exists(store.join(path, META_FILE)):
        return path
    for ckpts in (store.join(path, "checkpoints"), path):
        steps = [(int(m.group(1)), d) for d in _listdir(store, ckpts)
                 if (m := STEP_DIR.match(d)) and store.exists(store.join(ckpts, d, META_FILE))]
        if steps:
            return store.join(ckpts, max(steps)[1])
    raise CheckpointNotFoundError(f"no checkpoint at {path}{'' if store.exists(path) else ' (no such file or directory)'}: "
                                  f"expected a step-<N>/ directory holding {META_FILE}, or a run directory with "
                                  f"checkpoints/step-<N>/{META_FILE}; check the path")


def read_checkpoint(path: str, storage_options: dict | None = None) -> Checkpoint:
    """Read a checkpoint's meta.json (layout: docs/trainer.md), its store opened with ``storage_options``.
    A missing, inconsistent or edited field is a CheckpointError naming it."""
    ckpt_dir = find_checkpoint(path, storage_options)
    store = _store(ckpt_dir, storage_options)[0]
    meta = read_meta(ckpt_dir, store)
    loader = meta["loader"]
    return Checkpoint(
        path=ckpt_dir,
        step=int(meta["step"]),
        world_size=int(meta["world_size"]),
        global_batch=int(meta["global_batch"]),
        next_index=int(loader["next_index"]),
        seed=int(loader["seed"]),
        order=str(loader["order"]),
        split=str(loader.get("split") or meta["data"].get("split", "train")),
        window_shards=int(loader["window_shards"]) if loader.get("window_shards") is not None else None,
        manifest_sha256=str(meta["data"]["manifest_sha256"]),
        manifest_url=str(meta["data"]["manifest_url"]),
        manifest_changes=tuple(meta.get("manifest_changes") or ()),
        world_sizes=world_size_segments(ckpt_dir, meta, store),
        meta=meta,
        skips=tuple(meta.get("skips") or ()),
        storage_options=dict(storage_options or {}),
    )


def world_size_segments(ckpt_dir: str, meta: dict, store: Store = LOCAL) -> tuple[tuple[int, int | None], ...]:
    """(last step, world size) of each segment of the run, oldest first, from the ``resumed_from`` chain.

    A resume may change the world size (the loader's order does not depend on it, but the
    rank slices do). Each checkpoint records the one it resumed from; that checkpoint's
    meta.json gives the world size up to its step. When it has been pruned, the world size of
    the steps before it is unknown (None) rather than guessed; an edited one is refused.
    """
    segments = [(int(meta["step"]), int(meta["world_size"]))]
    chain = [os.path.basename(ckpt_dir)]
    while meta.get("resumed_from"):
        # Same checkpoints/ directory, even if the run directory was moved since.
        name = os.path.basename(str(meta["resumed_from"]).rstrip("/"))
        step = STEP_DIR.match(name)
        # A run resumes from an earlier step and saves later ones: the chain's steps strictly decrease,
        # so it ends. A name that is no step-<N>, or a step not below the last, is an edit (or a cycle).
        if not step or int(step.group(1)) >= segments[-1][0]:
            raise CheckpointError(f"{os.path.join(ckpt_dir, META_FILE)}: resumed_from names {name!r}, not an earlier "
                                  f"step-<N> than step {segments[-1][0]} (chain {' -> '.join(chain + [name])}): "
                                  f"{META_FILE} was edited or the checkpoints mixed up")
        chain.append(name)
        prev = store.join(os.path.dirname(ckpt_dir), name)
        if not store.exists(store.join(prev, META_FILE)):
            segments.append((int(step.group(1)), None))
            break
        meta = read_meta(prev, store)
        if int(meta["step"]) != int(step.group(1)):
            raise CheckpointError(f"{os.path.join(prev, META_FILE)}: step {meta['step']} in a directory named {name}")
        segments.append((int(meta["step"]), int(meta["world_size"])))
        ckpt_dir = prev
    return tuple(reversed(segments))


def open_manifest(ckpt: Checkpoint, manifest_url: str | None = None,
                  storage_options: dict | None = None) -> Published | PublishedMixture:
    """Load the manifest the checkpoint names (or one moved to ``manifest_url``), its store opened with
    ``storage_options`` (credentials, an endpoint), and insist on its hash.
    A mixture comes with its components, each checked against the hash the mixture pins.

    ``load_manifest`` already refuses a manifest whose content no longer matches its recorded
    hash; here the hash must also equal the one the checkpoint trained on.
    """
    url = manifest_url or ckpt.manifest_url
    if split_url(url)[0].startswith("grpc"):  # data.service named the data by hash: the URL is the service's
        raise AuditError(f"checkpoint {ckpt.path} was fed by gristmill serve at {url.split('#')[0]} (manifest "
                         f"{ckpt.manifest_sha256}); the audit reads the manifest and its document index from the "
                         "store: pass the version's URL with --manifest (the store the server reads, e.g. "
                         "--manifest STORE/<dataset>/v<N>)")
    try:
        published = load_data(url, **(storage_options or {}))
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
    """The trainer's own check (imports torch): every file matches meta.json's sha256, and the
    data position inside the DCP state equals meta.json's, so a consistent, re-hashed edit of
    meta.json is refused too. The DCP metadata is read only through the restricted unpickler."""
    from gristmill.trainer.checkpoint import verify, verify_copy

    problems = verify(ckpt.path) if local_path(ckpt.path) is not None else verify_copy(ckpt.path, ckpt.storage_options)
    if problems:
        raise CheckpointError(f"checkpoint {ckpt.path} does not verify: " + "; ".join(problems[:5]))
