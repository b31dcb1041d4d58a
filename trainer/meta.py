"""The checkpoint's ``meta.json``: its schema, writer, reader and validator (torch-free).

One module for everyone who writes or reads it: the trainer's checkpoints, the audit, and the
tests and benchmarks that hand-write checkpoint metadata. docs/trainer.md lists every field.

Three guards make an edited ``meta.json`` fail loudly instead of changing an answer:

- ``meta_sha256``: the sha256 of the file's own canonical JSON without that field. An edit that
  does not recompute it is refused (:func:`read_meta`).
- Fields recorded twice must agree (:func:`validate`): the loader's next index is step x global
  batch, the loader's seed, order and global batch equal the job config's, both manifest hashes
  are one.
- The data position (:data:`DATA_POSITION`: what decides which samples the model saw) is also
  stored inside the DCP state (state-dict entry :data:`DCP_KEY`), whose files meta.json's
  sha256s cover; :func:`compare_data_position` names any field where the two copies differ.
  A consistent, re-hashed edit of meta.json is caught there (trainer.checkpoint.verify).
"""
from __future__ import annotations

import json
import os
import re

from gristmill.manifests import canonical_json, sha256_json
from gristmill.manifests.errors import ManifestDecodeError
from gristmill.manifests.manifest import MAX_SEQ_LEN, parse_json
from gristmill.manifests.storage import LocalStore, Store, atomic_write

from . import skips as skips_
from .errors import CheckpointError  # noqa: F401  (raised here; trainer.errors is its home)

FORMAT = "gristmill-checkpoint-v2"
META_FILE = "meta.json"
SELF_HASH = "meta_sha256"
STEP_DIR = re.compile(r"^step-(\d+)$")
DCP_KEY = "gristmill.data_position"  # the DCP state-dict entry holding DATA_POSITION (uint8 canonical JSON)

# Fields every meta.json has (dotted paths), and the ones that decide what data the model saw.
REQUIRED = ("step", "world_size", "global_batch", "seq_len", "loader.next_index", "loader.seed", "loader.order",
            "data.manifest_sha256", "data.manifest_url")
DATA_KINDS = ("dataset", "mixture")  # what data.manifest_sha256 names; absent: dataset
LOCAL = LocalStore()
DATA_POSITION = ("step", "world_size", "global_batch", "loader", "data.manifest_sha256", "data.split",
                 "manifest_changes", "skips")
OPTIONAL_POSITION = ("skips",)  # absent in checkpoints written before skips were recorded (none then)


def new_meta(*, step: int, world_size: int, global_batch: int, seq_len: int, loader: dict, manifest_sha256: str,
             manifest_url: str, split: str = "train", data: dict | None = None, manifest_changes: list | tuple = (),
             resumed_from: str | None = None, job: dict | None = None, skips: list | tuple = (), **extra) -> dict:
    """A meta.json's content: the required fields plus ``extra`` (the trainer adds RNG, model,
    scheduler, versions...). ``loader`` is the loader's state_dict(); ``data`` adds fields to the
    ``data`` section (dataset name, version); ``skips`` the skipped sample ranges (trainer/skips.py)."""
    return {"format": FORMAT, "step": step, "world_size": world_size, "global_batch": global_batch, "seq_len": seq_len,
            "tokens_seen": step * global_batch * seq_len, "loader": dict(loader),
            "data": {**(data or {}), "manifest_sha256": manifest_sha256, "manifest_url": manifest_url, "split": split},
            "manifest_changes": list(manifest_changes), "skips": [dict(s) for s in skips], "resumed_from": resumed_from,
            "job": job or {}, **extra}


def data_fields(published) -> dict:
    """The ``data`` section's descriptive fields of a dataset or a mixture (manifests.mixture): its name and
    version; a mixture's also ``kind: mixture`` and its components, each pinned by its manifest's sha256
    (the mixture hash itself is ``data.manifest_sha256``, which the data position covers)."""
    m = published.manifest
    out = {"dataset": m.dataset, "version": m.version}
    if getattr(m, "kind", "dataset") == "mixture":
        out["kind"] = "mixture"
        out["components"] = [{"name": c.name, "dataset": c.dataset, "sha256": c.sha256, "parts": c.parts,
                              "period": m.period, "exhausted": c.exhausted, "version": pub.manifest.version}
                             for c, pub in zip(m.components, published.components)]
    return out


def content_sha256(meta: dict) -> str:
    """sha256 of the canonical JSON of ``meta`` without its own ``meta_sha256``."""
    return sha256_json({k: v for k, v in meta.items() if k != SELF_HASH})


def seal_meta(meta: dict) -> tuple[dict, bytes]:
    """``meta`` sealed with its self-hash, and the bytes of its meta.json."""
    sealed = {**{k: v for k, v in meta.items() if k != SELF_HASH}, SELF_HASH: content_sha256(meta)}
    return sealed, (json.dumps(sealed, indent=1, sort_keys=True) + "\n").encode()


def write_meta(directory: str, meta: dict) -> dict:
    """Seal ``meta`` with its self-hash and write ``<directory>/meta.json`` atomically; returns what was written."""
    sealed, data = seal_meta(meta)
    atomic_write(os.path.join(directory, META_FILE), data)
    return sealed


def read_meta(directory: str, store: Store | None = None) -> dict:
    """Load and check ``<directory>/meta.json`` (a local directory, or a URL of ``store``): format,
    self-hash, required fields, consistency."""
    path = (store or LOCAL).join(directory, META_FILE)
    try:
        data = (store or LOCAL).read(path)
    except FileNotFoundError as e:
        raise CheckpointError(f"{directory}: no {META_FILE}") from e
    return parse_meta(data, path)


def parse_meta(data: bytes, path: str) -> dict:
    """Check the bytes of a meta.json read from ``path``: what :func:`read_meta` checks."""
    try:
        meta = parse_json(data, path)  # strict: no duplicate keys, NaN, Infinity or out-of-range numbers
    except ManifestDecodeError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{path}: format is {got!r}, expected {FORMAT!r}")
    recorded, actual = meta.get(SELF_HASH), content_sha256(meta)
    if recorded != actual:
        raise CheckpointError(f"{path}: {SELF_HASH} {recorded} does not match the file's content ({actual}): "
                              f"{META_FILE} was edited after the trainer wrote it")
    validate(meta, path)
    return meta


def get(meta: dict, dotted: str, where: str):
    """``meta["a"]["b"]`` for ``"a.b"``; a missing field is a CheckpointError naming it."""
    value = meta
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise CheckpointError(f"{where}: missing field {dotted!r}")
        value = value[key]
    return value


def validate(meta: dict, where: str) -> None:
    """Required fields are present and fields recorded twice agree: a hand-edited meta.json must
    not give a confident answer."""
    for dotted in REQUIRED:
        get(meta, dotted, where)
    step, B, W = meta["step"], meta["global_batch"], meta["world_size"]
    loader = meta["loader"]
    if not all(isinstance(v, int) for v in (step, B, W, loader["next_index"], loader["seed"])):
        raise CheckpointError(f"{where}: step, global_batch, world_size, loader.next_index and loader.seed must be integers")
    if B <= 0 or W <= 0 or B % W:
        raise CheckpointError(f"{where}: global_batch {B} is not a positive multiple of world_size {W}")
    if isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{where}: step {step!r} is negative: a checkpoint is saved after optimizer step 0 or later")
    _check_tokens_seen(meta, where)
    skips = meta.get("skips", [])
    if (bad := skips_.problem(skips, step, B)) is not None:
        raise CheckpointError(f"{where}: {bad}")
    expected, shift = skips_.next_index(step, B, skips), skips_.shift_before(skips, step + 1)
    if loader["next_index"] != expected:
        raise CheckpointError(f"{where}: loader.next_index {loader['next_index']} is not step {step} x global_batch {B}"
                              + (f" + {shift} skipped at rewinds" if shift else "") + f" = {expected}; optimizer "
                              f"step n consumes samples [(n-1)*B, n*B) after the skips before it (trainer/skips.py)")
    if loader.get("global_batch", B) != B:
        raise CheckpointError(f"{where}: loader.global_batch {loader['global_batch']} differs from global_batch {B}")
    data_sha = meta["data"]["manifest_sha256"]
    if loader.get("manifest_sha256", data_sha) != data_sha:
        raise CheckpointError(f"{where}: loader.manifest_sha256 {loader['manifest_sha256']} differs from "
                              f"data.manifest_sha256 {data_sha}")
    kind = meta["data"].get("kind", "dataset")  # checkpoints written before mixtures have no kind: a dataset
    if kind not in DATA_KINDS:
        raise CheckpointError(f"{where}: data.kind {kind!r} is not one of {', '.join(DATA_KINDS)}")
    if kind == "mixture" and not (isinstance(meta["data"].get("components"), list) and meta["data"]["components"]
                                  and all(isinstance(c, dict) and "name" in c and "sha256" in c
                                          for c in meta["data"]["components"])):
        raise CheckpointError(f"{where}: data.kind is mixture but data.components does not list the components "
                              f"(name, sha256)")
    job = (meta.get("job") or {}).get("data", {})
    for key, value in (("seed", loader["seed"]), ("order", loader["order"]), ("global_batch", B)):
        if key in job and job[key] != value:
            name = "global_batch" if key == "global_batch" else f"loader.{key}"
            raise CheckpointError(f"{where}: {name} {value!r} differs from the job config's data.{key} {job[key]!r}")


def _check_tokens_seen(meta: dict, where: str) -> None:
    """``tokens_seen`` (written by every trainer, optional in older metas) is a count the steps
    account for: an integer >= 0, ``step x global_batch x seq_len`` while the data never changed
    (every step then consumed one global batch of seq_len-token samples), and never more than
    the steps could consume at the longest row a manifest holds."""
    if "tokens_seen" not in meta:
        return
    tokens, step, B, seq_len = meta["tokens_seen"], meta["step"], meta["global_batch"], meta["seq_len"]
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 0 < seq_len <= MAX_SEQ_LEN:
        raise CheckpointError(f"{where}: seq_len {seq_len!r} is not an integer in [1, {MAX_SEQ_LEN}]")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise CheckpointError(f"{where}: tokens_seen {tokens!r} is not a count (an integer >= 0)")
    same_data = not meta.get("manifest_changes")
    if (same_data and tokens != step * B * seq_len) or tokens > step * B * MAX_SEQ_LEN or (tokens == 0) != (step == 0):
        raise CheckpointError(f"{where}: tokens_seen {tokens:,} does not follow from step {step} x global_batch {B} "
                              f"x seq_len {seq_len}" + ("" if same_data else " (nor any seq_len of the manifests used)"))


def data_position(meta: dict) -> dict:
    """The fields of :data:`DATA_POSITION`, flattened to dotted names (``loader.seed``, ...)."""
    out = {}
    for dotted in DATA_POSITION:
        if dotted in OPTIONAL_POSITION and dotted not in meta:
            continue
        value = get(meta, dotted, META_FILE)
        if isinstance(value, dict):
            out.update({f"{dotted}.{k}": v for k, v in value.items()})
        else:
            out[dotted] = value
    return out


def encode_data_position(meta: dict) -> bytes:
    return canonical_json(data_position(meta))


def compare_data_position(meta: dict, stored: bytes, where: str) -> None:
    """Refuse when meta.json's data position differs from the copy inside the DCP state, naming the field."""
    try:
        theirs = json.loads(stored)
    except ValueError as e:
        raise CheckpointError(f"{where}: the data position stored in the DCP state is not valid JSON: {e}") from e
    # Through JSON both ways, so tuples and lists compare equal.
    ours = json.loads(canonical_json(data_position(meta)))
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key, "<missing>") != theirs.get(key, "<missing>"):
            raise CheckpointError(
                f"{where}: {key} is {ours.get(key, '<missing>')!r} in {META_FILE} but {theirs.get(key, '<missing>')!r} "
                f"in the DCP state the checkpoint's file checksums cover: {META_FILE} was edited")


# -- the run record: what ran the job, beside what it trained on ---------------------------------
IMAGE_DIGEST_ENV = "GRISTMILL_IMAGE_DIGEST"  # set by the deploy manifests to the container image's digest
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"


def nvidia_driver_version(path: str = NVIDIA_DRIVER_FILE) -> str | None:
    """The NVIDIA kernel driver's version (``550.54.15``) from the driver's own file, or None without one."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def run_record(*, device_name: str, tokenizer_sha256: str, hostnames: list[str], environ=os.environ) -> dict:
    """meta.json's ``run_record``: the tokenizer, the device, the CUDA / driver / NCCL versions where
    present (None elsewhere), the container image digest when ``$GRISTMILL_IMAGE_DIGEST`` names it,
    and each rank's hostname (gathered once at the start). torch is imported here, not at module level:
    the audit reads meta.json without torch."""
    import torch

    cuda = torch.version.cuda if torch.cuda.is_available() else None
    nccl = None
    if cuda and torch.distributed.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return {"tokenizer_sha256": tokenizer_sha256, "device": device_name, "cuda": cuda,
            "cuda_driver": nvidia_driver_version() if cuda else None, "nccl": nccl,
            "image_digest": environ.get(IMAGE_DIGEST_ENV) or None, "hostnames": list(hostnames)}
