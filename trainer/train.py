"""The training loop: ``torchrun --nproc_per_node N -m gristmill.trainer.train JOB.yaml`` (or ``gristmill train``).

One optimizer step n (1-based) consumes the loader's step n-1, i.e. the global sample indices
[(n-1)*B, n*B) of the manifest's training order, split across ranks by the loader. Checkpoint
``step-N`` therefore holds the model after samples [0, N*B) and the loader's next index N*B.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gristmill.loader import Loader
from gristmill.manifests import ManifestError, code_version
from gristmill.manifests.mixture import load_data
from gristmill.manifests.shards import atomic_write

from . import config as config_mod
from .cli import add_arguments, print_config
from .checkpoint import Checkpointer, committed, library_versions, set_rng_state
from .config import JobConfig
from .meta import data_fields, new_meta
from .metrics import MetricsLog, device_name, format_step, mfu, peak_flops, young_daly_interval_s
from .model import KERNEL_FIELDS, Transformer, count_params, flops_per_token, model_args, position_ids
from .parallelize import build_mesh, init_distributed, parallelize, resolve_attention, resolve_mixed_precision
from gristmill.errors import GristmillError

log = logging.getLogger("gristmill.trainer")


class TrainingError(GristmillError):
    """The run cannot continue: the message says why and what to do."""


class ManifestMismatchError(ManifestError):
    """A checkpoint was trained on a different data manifest than the job names."""


class Interrupted(TrainingError):
    """SIGINT or SIGTERM stopped the run between two steps; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int, step: int, latest: str | None):
        self.exit_code = 128 + signum
        where = f"the newest checkpoint is {latest}" if latest else "no checkpoint was written yet"
        super().__init__(f"{signal.Signals(signum).name} after step {step}: stopped; {where} "
                         f"(run the same command to resume)")


@dataclass(frozen=True)
class Hooks:
    """Optional callbacks into the run (none by default). The tests inject faults through them."""

    loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None  # (step, micro-batch loss) -> loss to backpropagate
    before_commit: Callable[[int, str], None] | None = None  # (step, temp dir) before a save's commit (Checkpointer)


class StopSignals:
    """While active, SIGINT and SIGTERM (what schedulers send) only set ``signum``: the loop stops
    at the end of the step, after committing a checkpoint being written, instead of a
    KeyboardInterrupt tearing through collectives, loader threads and a half-written save. A
    second signal interrupts at once, except a repeat of the first within ``REPEAT_S``: a Ctrl-C
    under torchrun reaches each worker twice, from the terminal and forwarded by torchrun."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    REPEAT_S = 2.0

    def __init__(self):
        self.signum = 0
        self._first_at = 0.0
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signum:
            if signum == self.signum and time.monotonic() - self._first_at < self.REPEAT_S:
                return
            raise KeyboardInterrupt
        self.signum, self._first_at = signum, time.monotonic()
        log.warning("%s: stopping after this step (again to stop now)", signal.Signals(signum).name)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


# -- small pieces ---------------------------------------------------------------------------
def lr_at(step: int, cfg: config_mod.OptimizerConfig, total_steps: int) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine down to ``lr * min_lr_ratio``."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_optimizer(model: torch.nn.Module, cfg: config_mod.OptimizerConfig) -> torch.optim.AdamW:
    # Weight decay on matrices only; norm gains are scale parameters that decay would shrink to 0.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def local_batch_sizes(cfg: JobConfig, world_size: int) -> tuple[int, int]:
    """(sequences per rank per step, micro-batches per step)."""
    B = cfg.data.global_batch
    if B % world_size:
        raise TrainingError(f"data.global_batch={B} does not divide by the world size {world_size}")
    local = B // world_size
    micro = cfg.data.micro_batch or local
    if local % micro:
        raise TrainingError(f"data.micro_batch={micro} does not divide the per-rank batch {local} "
                            f"(global_batch {B} / world size {world_size})")
    return local, local // micro


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


# torch's uint16/uint32 have only limited eager support (on CUDA above all): their bytes travel as
# the signed type of the same width and are masked back to the unsigned value after widening.
_AS_SIGNED = {torch.uint16: (torch.int16, 0xFFFF), torch.uint32: (torch.int32, 0xFFFFFFFF)}


def inputs_and_labels(batch: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's int64 inputs and labels on ``device``. The loader hands over one (B, seq_len + 1)
    buffer in the shards' dtype (a quarter of int64's bytes over PCIe), widened and shifted here."""
    tokens = batch["tokens"]
    if tokens.dtype in _AS_SIGNED:
        signed, mask = _AS_SIGNED[tokens.dtype]
        tokens = tokens.view(signed).to(device, non_blocking=True).long() & mask
    else:
        tokens = tokens.to(device, non_blocking=True).long()
    return tokens[:, :-1], tokens[:, 1:]


class SampleLog:
    """Rank 0 writes ``<run_dir>/samples.jsonl``: one line per optimizer step with the global sample
    indices it consumed, in rank order. On resume, lines after the checkpoint's step are dropped
    (those steps' weights were discarded with the crash), so the file always describes the
    lineage of the newest model."""

    def __init__(self, run_dir: str, enabled: bool, resume_step: int):
        self.path = os.path.join(run_dir, "samples.jsonl")
        self.enabled = enabled
        if enabled:
            self._truncate_after(resume_step)

    def _truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        atomic_write(self.path, "".join(keep).encode())

    def append(self, step: int, indices: list[int]) -> None:
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "indices": indices}) + "\n")


def gather_indices(local: torch.Tensor, world_size: int) -> list[int]:
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts).tolist()


# -- the run --------------------------------------------------------------------------------
def train(cfg: JobConfig, *, stop_after_step: int | None = None, allow_manifest_change: bool = False,
          hooks: Hooks | None = None) -> dict:
    hooks = hooks or Hooks()
    d = init_distributed()
    rank0 = d.rank == 0
    run_dir = cfg.run.dir
    os.makedirs(run_dir, exist_ok=True)
    allow_manifest_change = allow_manifest_change or cfg.checkpoint.allow_manifest_change

    # Data: the manifest pins vocabulary, sequence length and the content hash the checkpoint records.
    pub = load_data(cfg.data.manifest, expected_sha256=cfg.data.expected_sha256)  # a dataset or a mixture
    manifest = pub.manifest
    seq_len, B = manifest.seq_len, cfg.data.global_batch
    _, n_micro = local_batch_sizes(cfg, d.world_size)

    # Model: built whole from the seed on every rank, then sharded.
    torch.manual_seed(cfg.run.seed)
    overrides = {k: v for k, v in cfg.model.to_dict().items() if k != "preset"}
    args = model_args(cfg.model.preset, manifest.tokenizer.vocab_size, seq_len,
                      attention=resolve_attention(cfg.parallelism.attention, d.device), **overrides)
    model = Transformer(args)
    mesh = build_mesh(d.device, d.world_size, cfg.parallelism.dp_shard)
    param_dtype = resolve_mixed_precision(cfg.parallelism.mixed_precision, d.device)
    parallelize(model, mesh, param_dtype=param_dtype, activation_checkpoint=cfg.parallelism.activation_checkpoint,
                compile=cfg.parallelism.compile)
    optimizer = build_optimizer(model, cfg.optimizer)

    # Resume: the newest checkpoint that verifies; its manifest must match unless overridden.
    ckpt = Checkpointer(run_dir, keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save, rank=d.rank,
                        world_size=d.world_size, device=d.device, before_commit=hooks.before_commit)
    start_step, tokens_seen, skipped_total, manifest_changes, resumed_from = 0, 0, 0, [], None
    loader_state = None
    if cfg.checkpoint.enabled and cfg.checkpoint.resume:
        path, meta = ckpt.latest()
        if path is not None:
            manifest_changes = check_resume(meta, path, pub, cfg, allow_manifest_change)
            check_model_args(meta, path, args)
            ckpt.load(path, model, optimizer, meta)
            start_step, tokens_seen = meta["step"], meta["tokens_seen"]
            skipped_total = meta["bad_steps"]["skipped_total"]
            if d.rank < len(meta["rng"]):
                set_rng_state(meta["rng"][d.rank])
            loader_state = {**meta["loader"], "manifest_sha256": manifest.sha256}
            resumed_from = path
            if rank0:
                log.info("resumed from %s (step %d, next sample %d, world size %d -> %d)", path, start_step,
                         meta["loader"]["next_index"], meta["world_size"], d.world_size)

    # Always gristmill's Loader: the audit answers from its pure order, so no other loader may stand in.
    loader = Loader(pub.url, split="train", seed=cfg.data.seed, global_batch=B, rank=d.rank, world_size=d.world_size,
                    order=cfg.data.order, cache_dir=cfg.data.cache_dir, prefetch=cfg.data.prefetch,
                    expected_sha256=manifest.sha256, token_dtype=None,
                    documents=cfg.model.document_mask)  # position ids per row (document mask)
    metrics = MetricsLog(run_dir, enabled=rank0, tensorboard=cfg.run.tensorboard)
    try:
        if loader_state is not None:
            loader.load_state_dict(loader_state)
        with StopSignals() as stop:
            return _loop(cfg, d, model, optimizer, ckpt, loader, metrics, hooks, stop, pub=pub, args=args,
                         n_micro=n_micro, start_step=start_step, tokens_seen=tokens_seen, skipped_total=skipped_total,
                         manifest_changes=manifest_changes, resumed_from=resumed_from, stop_after_step=stop_after_step,
                         param_dtype=param_dtype)
    finally:
        loader.close()  # its prefetch threads must not outlive the run, whatever ended it
        metrics.close()


def _loop(cfg: JobConfig, d, model, optimizer, ckpt: Checkpointer, loader: Loader, metrics: MetricsLog, hooks: Hooks,
          stop: StopSignals, *, pub, args, n_micro: int, start_step: int, tokens_seen: int, skipped_total: int,
          manifest_changes: list, resumed_from: str | None, stop_after_step: int | None, param_dtype) -> dict:
    rank0 = d.rank == 0
    run_dir, manifest = cfg.run.dir, pub.manifest
    seq_len, B = manifest.seq_len, cfg.data.global_batch
    samples = SampleLog(run_dir, rank0, start_step)
    flops_tok = flops_per_token(args, seq_len)
    dev_name = device_name(d.device)
    peak = peak_flops(dev_name)
    if rank0:
        n = count_params(args)
        log.info("model %s: %s parameters (%s non-embedding), %d layers, dim %d; %s; world size %d, "
                 "global batch %d x %d tokens, %d micro-batch(es) per rank", cfg.model.preset, f"{n['total']:,}",
                 f"{n['non_embedding']:,}", args.n_layers, args.dim, param_dtype, d.world_size, B, seq_len, n_micro)
        if peak is None:
            log.info("MFU: unknown peak FLOP/s for %r (not in trainer.metrics.PEAK_BF16_FLOPS); MFU is not reported",
                     dev_name)

    def meta_for(step: int) -> dict:
        return new_meta(
            step=step, world_size=d.world_size, global_batch=B, seq_len=seq_len, loader=loader.state_dict(),
            manifest_sha256=manifest.sha256, manifest_url=pub.url, split="train", manifest_changes=manifest_changes,
            resumed_from=resumed_from, job=cfg.to_dict(), tokens_seen=tokens_seen,
            data=data_fields(pub),
            scheduler={"kind": "warmup_cosine", "step": step, "lr": cfg.optimizer.lr,
                       "warmup_steps": cfg.optimizer.warmup_steps, "total_steps": cfg.run.steps,
                       "min_lr_ratio": cfg.optimizer.min_lr_ratio,
                       "last_lr": lr_at(max(step, 1), cfg.optimizer, cfg.run.steps)},
            bad_steps={"skipped_total": skipped_total, "consecutive": consecutive_bad},
            model_args=asdict(args), code_version=code_version(), versions=library_versions())

    def save(step: int) -> None:
        blocked_s = ckpt.save(step, model, optimizer, meta_for(step))
        interval_s = young_daly_interval_s(blocked_s, cfg.checkpoint.mtbf_hours * 3600)
        metrics.write({"kind": "checkpoint", "step": step, "blocked_s": blocked_s, "young_daly_interval_s": interval_s})
        if rank0:
            report_interval(blocked_s, interval_s, cfg, last_step_s)

    it = iter(loader)
    consecutive_bad, last_step_s, last_saved, losses = 0, None, start_step, []
    end_step = cfg.run.steps if stop_after_step is None else min(cfg.run.steps, stop_after_step)
    model.train()
    for step in range(start_step + 1, end_step + 1):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            raise TrainingError(f"the loader ran out of training data at step {step}") from None
        wait_s = time.perf_counter() - t0

        lr = lr_at(step, cfg.optimizer, cfg.run.steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, grad_norm = train_step(model, batch, n_micro, cfg.optimizer.grad_clip, d.device, step=step,
                                     loss_hook=hooks.loss)
        ok = math.isfinite(loss) and math.isfinite(grad_norm)
        if ok:
            optimizer.step()
            consecutive_bad = 0
        else:
            skipped_total += 1
            consecutive_bad += 1
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += B * seq_len
        if d.device.type == "cuda":
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t0
        last_step_s = step_s

        indices = gather_indices(batch["indices"].to(d.device), d.world_size)
        samples.append(step, indices)
        if step % cfg.run.log_every == 0 or not ok or step == end_step:
            times = [torch.zeros(1, device=d.device) for _ in range(d.world_size)]
            dist.all_gather(times, torch.tensor([step_s], device=d.device))
            tps = B * seq_len / step_s
            record = {"kind": "train", "step": step, "loss": loss, "grad_norm": grad_norm, "lr": lr,
                      "tokens_seen": tokens_seen, "tokens_per_s": tps, "tokens_per_s_per_device": tps / d.world_size,
                      "mfu": mfu(tps / d.world_size, flops_tok, peak), "input_wait_s": wait_s,
                      "input_wait_pct": 100.0 * wait_s / step_s, "step_s": step_s,
                      "rank_step_s": [t.item() for t in times], "skipped": not ok, "skipped_total": skipped_total}
            metrics.write(record)
            if rank0:
                log.info(format_step(record))
        losses.append(loss)
        if not ok and rank0:
            log.warning("step %d: non-finite loss %s or grad norm %s: optimizer step skipped (%d in a row, %d total)",
                        step, loss, grad_norm, consecutive_bad, skipped_total)
        if not ok and consecutive_bad >= cfg.optimizer.max_bad_steps:
            raise TrainingError(
                f"{consecutive_bad} consecutive steps (up to step {step}) had a non-finite loss or gradient norm "
                f"(optimizer.max_bad_steps={cfg.optimizer.max_bad_steps}); stopping. Resume from the last "
                f"checkpoint in {run_dir}/checkpoints with a lower optimizer.lr or a tighter grad_clip")

        if cfg.eval.every and step % cfg.eval.every == 0:
            val = evaluate(model, cfg, pub.url, manifest.sha256, d)
            metrics.write({"kind": "eval", "step": step, "val_loss": val})
            if rank0:
                log.info("step %6d  val_loss %.4f", step, val)

        ckpt.poll()
        if cfg.checkpoint.enabled and cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
            save(step)
            last_saved = step
        if signum := agreed_stop_signal(stop, d):
            ckpt.wait()  # a save in flight is finished and committed, never abandoned half-written
            latest = committed(run_dir)
            raise Interrupted(signum, step, latest[-1][1] if latest else None)

    if cfg.checkpoint.enabled and last_saved != end_step and end_step > start_step:
        save(end_step)  # the end of the run (or of this slice of it) is always checkpointed
    ckpt.wait()
    return {"start_step": start_step, "end_step": end_step, "losses": losses, "skipped_total": skipped_total,
            "resumed_from": resumed_from}


def agreed_stop_signal(stop: StopSignals, d) -> int:
    """The stop signal any rank got (0: none). Every rank must stop after the same step, or the
    others would wait forever in the next step's collectives: one tiny all-reduce per step."""
    if d.world_size == 1:
        return stop.signum
    t = torch.tensor([stop.signum], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def train_step(model, batch: dict, n_micro: int, grad_clip: float, device, *, step: int = 0,
               loss_hook: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float]:
    """Forward and backward over ``n_micro`` micro-batches, then clip. Returns the global mean loss
    and the global gradient norm; the caller decides whether to step. ``loss_hook(step, loss)``
    may replace each micro-batch's loss before backward (Hooks.loss)."""
    inputs, labels = inputs_and_labels(batch, device)
    inputs, labels = inputs.chunk(n_micro), labels.chunk(n_micro)
    positions = position_ids(batch, device, n_micro)  # document mask: per-document rope and attention
    loss_sum = torch.zeros((), device=device)
    for i, (x, y, p) in enumerate(zip(inputs, labels, positions)):
        # Reduce-scatter gradients only after the last micro-batch; earlier ones accumulate locally.
        model.set_requires_gradient_sync(i == n_micro - 1)
        loss = cross_entropy(model(x, p), y) / n_micro
        if loss_hook is not None:
            loss = loss_hook(step, loss)
        loss.backward()
        loss_sum += loss.detach()
    # FSDP averages gradients over ranks; average the logged loss the same way.
    dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
    loss_sum /= dist.get_world_size()
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if hasattr(norm, "full_tensor"):  # a DTensor: the norm over every shard
        norm = norm.full_tensor()
    return loss_sum.item(), norm.item()


@torch.no_grad()
def evaluate(model, cfg: JobConfig, url: str, sha256: str, d) -> float:
    """Mean loss over the first ``eval.batches`` batches of the validation split (same batches every time)."""
    B = cfg.eval.global_batch or cfg.data.global_batch
    if B % d.world_size:
        raise TrainingError(f"eval.global_batch={B} does not divide by the world size {d.world_size}")
    val = Loader(url, split="validation", seed=cfg.data.seed, global_batch=B, rank=d.rank, world_size=d.world_size,
                 order="sequential", cache_dir=cfg.data.cache_dir, prefetch=cfg.data.prefetch, expected_sha256=sha256,
                 token_dtype=None, documents=cfg.model.document_mask)
    model.eval()
    total = torch.zeros((), device=d.device)
    n = 0
    for batch in val:
        inputs, labels = inputs_and_labels(batch, d.device)
        total += cross_entropy(model(inputs, position_ids(batch, d.device, 1)[0]), labels)
        n += 1
        if n == cfg.eval.batches:
            break
    val.close()
    model.train()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.item() / max(n, 1) / d.world_size


def check_resume(meta: dict, path: str, pub, cfg: JobConfig, allow_manifest_change: bool) -> list[dict]:
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


def report_interval(save_s: float, interval: float, cfg: JobConfig, step_s: float | None) -> None:
    """Print the Young/Daly interval for the measured save cost (the time training was blocked)
    and the configured MTBF."""
    steps = f" = about {max(1, round(interval / step_s)):,} steps at {step_s:.3f} s/step" if step_s else ""
    log.info("checkpoint saved in %.2f s; Young/Daly interval for MTBF %.1f h: every %.0f s%s (checkpoint.every=%d)",
             save_s, cfg.checkpoint.mtbf_hours, interval, steps, cfg.checkpoint.every)


# -- entry point ----------------------------------------------------------------------------
def run(args: argparse.Namespace, hooks: Hooks | None = None) -> int:
    """Train; 0 when done, 128 + signal number when SIGINT/SIGTERM stopped it (the message says
    which checkpoint to resume from)."""
    if args.print_config:
        return print_config(args)
    cfg = config_mod.load(args.job, args.overrides)
    try:
        train(cfg, stop_after_step=args.stop_after_step, allow_manifest_change=args.allow_manifest_change, hooks=hooks)
    except Interrupted as e:
        print(f"gristmill train: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None, hooks: Hooks | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gristmill.trainer.train", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        return run(args, hooks)
    except GristmillError as e:
        print(f"gristmill train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
