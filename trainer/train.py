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
import statistics
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
from .checkpoint import Checkpointer, committed, compare_states, library_versions, set_rng_state
from .config import JobConfig
from .errors import CheckpointError
from .meta import data_fields, new_meta
from .metrics import MetricsLog, device_name, format_step, mfu, peak_flops, young_daly_interval_s
from .budget import expected_wall_s, format_bytes, format_seconds, memory_budget, planned_flops
from .model import KERNEL_FIELDS, count_params, flops_per_token, flops_per_token_terms, model_args, position_ids
from .parallelize import build_mesh, build_model, init_distributed, resolve_attention, resolve_mixed_precision
from .state import LoaderState, ModelState, OptimizerState, TrainState, WarmupCosine
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
def build_optimizer(model: torch.nn.Module, cfg: config_mod.OptimizerConfig, device: torch.device) -> torch.optim.AdamW:
    # Weight decay on matrices only; norm gains are scale parameters that decay would shrink to 0.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # Fused on CUDA: one kernel for all parameters instead of a few per tensor. CPU keeps the
    # for-each path, which the bitwise CPU tests were written against.
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=device.type == "cuda")


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
    """With ``run.log_samples``, rank 0 writes ``<run_dir>/samples.jsonl``: one line per optimizer
    step with the global sample indices the ranks' batches carried, in rank order (one all-gather
    per step: a first-hand record for the audit to be checked against; the indices themselves
    follow from the checkpoint's loader state). On resume, lines after the checkpoint's step are
    dropped (those steps' weights were discarded with the crash), so the file always describes
    the lineage of the newest model."""

    def __init__(self, run_dir: str, *, enabled: bool, writer: bool, world_size: int, resume_step: int):
        self.path = os.path.join(run_dir, "samples.jsonl")
        self.enabled, self.writer, self.world_size = enabled, writer, world_size
        if enabled and writer:
            self._truncate_after(resume_step)

    def _truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
        atomic_write(self.path, "".join(keep).encode())

    def append(self, step: int, local_indices: torch.Tensor, device) -> None:
        """Collective when enabled: every rank calls it every step."""
        if not self.enabled:
            return
        local = local_indices.to(device)
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        if self.writer:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "indices": torch.cat(parts).tolist()}) + "\n")


# -- the run --------------------------------------------------------------------------------
ESTIMATE_AFTER_STEPS = 5  # steps measured before the expected wall time is printed


class Trainer:
    """One training run, built in reading order: process group, data, model (sharded), optimizer,
    schedule, loader, then the state a checkpoint holds (``self.states``: model, optimizer,
    scheduler, loader and train state, each DCP ``Stateful``, see trainer/state.py).
    ``resume()`` loads the newest checkpoint that verifies; ``train()`` is the loop; ``close()``
    stops the loader's threads (a ``with`` block calls it)."""

    def __init__(self, cfg: JobConfig, *, allow_manifest_change: bool = False, hooks: Hooks | None = None):
        self.cfg, self.hooks = cfg, hooks or Hooks()
        self.allow_manifest_change = allow_manifest_change or cfg.checkpoint.allow_manifest_change
        self.dist = d = init_distributed()
        self.rank0 = d.rank == 0
        self.run_dir = cfg.run.dir
        os.makedirs(self.run_dir, exist_ok=True)

        # Data: the manifest pins vocabulary, sequence length and the content hash the checkpoint records.
        self.pub = load_data(cfg.data.manifest, expected_sha256=cfg.data.expected_sha256)  # a dataset or a mixture
        self.manifest = self.pub.manifest
        self.seq_len, self.global_batch = self.manifest.seq_len, cfg.data.global_batch
        _, self.n_micro = local_batch_sizes(cfg, d.world_size)

        # Model, sharded over the mesh; optimizer and schedule over its shards. The global generators
        # start from the seed on every rank; the weights come from generators of their own (trainer/init.py).
        torch.manual_seed(cfg.run.seed)
        overrides = {k: v for k, v in cfg.model.to_dict().items() if k != "preset"}
        self.args = model_args(cfg.model.preset, self.manifest.tokenizer.vocab_size, self.seq_len,
                               attention=resolve_attention(cfg.parallelism.attention, d.device), **overrides)
        self.mesh = build_mesh(d.device, d.world_size, cfg.parallelism.dp_shard)
        self.param_dtype = resolve_mixed_precision(cfg.parallelism.mixed_precision, d.device)
        self.model = build_model(self.args, self.mesh, device=d.device, seed=cfg.run.seed, param_dtype=self.param_dtype,
                                 activation_checkpoint=cfg.parallelism.activation_checkpoint,
                                 compile=cfg.parallelism.compile)
        self.optimizer = build_optimizer(self.model, cfg.optimizer, d.device)
        self.local_params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                                for p in self.model.parameters())
        self.budget = memory_budget(self.args, n_params=count_params(self.args)["total"],
                                    shards=self.mesh.size(-1),  # the FSDP degree; HSDP replicas hold the same shards
                                    compute_bytes=torch.tensor([], dtype=self.param_dtype).element_size(),
                                    micro_batch=cfg.data.micro_batch or self.global_batch // d.world_size,
                                    seq_len=self.seq_len, activation_checkpoint=cfg.parallelism.activation_checkpoint)
        self.scheduler = WarmupCosine(self.optimizer, cfg.optimizer, cfg.run.steps)

        self.checkpointer = Checkpointer(self.run_dir, keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save,
                                         rank=d.rank, world_size=d.world_size, device=d.device,
                                         before_commit=self.hooks.before_commit)
        self.manifest_changes: list[dict] = []
        self.resumed_from: str | None = None
        self.flops_per_token = flops_per_token(self.args, self.seq_len)
        self.peak = peak_flops(device_name(d.device))
        self.last_step_s: float | None = None

        # Last, the two that hold threads and files (close() releases them). Always gristmill's
        # Loader: the audit answers from its pure order, so no other loader may stand in.
        self.metrics = MetricsLog(self.run_dir, enabled=self.rank0, tensorboard=cfg.run.tensorboard)
        self.loader = Loader(self.pub, split="train", seed=cfg.data.seed, global_batch=self.global_batch,
                             rank=d.rank, world_size=d.world_size, order=cfg.data.order, cache_dir=cfg.data.cache_dir,
                             prefetch=cfg.data.prefetch, expected_sha256=self.manifest.sha256, token_dtype=None,
                             documents=cfg.model.document_mask)  # position ids per row (document mask)
        self.train_state = TrainState()
        self.loader_state = LoaderState(self.loader)
        self.states = {"model": ModelState(self.model), "optimizer": OptimizerState(self.model, self.optimizer),
                       "scheduler": self.scheduler, "loader": self.loader_state, "train_state": self.train_state}

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.loader.close()  # its prefetch threads must not outlive the run, whatever ended it
        self.metrics.close()

    # -- resume ---------------------------------------------------------------------------------
    def resume(self) -> None:
        """Load the newest checkpoint that verifies; its manifest must match unless overridden."""
        if not (self.cfg.checkpoint.enabled and self.cfg.checkpoint.resume):
            return
        path, meta = self.checkpointer.latest()
        if path is None:
            return
        self.manifest_changes = check_resume(meta, path, self.pub, self.cfg, self.allow_manifest_change)
        check_model_args(meta, path, self.args)
        self.loader_state.manifest_sha256 = self.manifest.sha256  # a change was allowed, or there is none
        self.checkpointer.load(path, self.states, meta)
        check_states_match_meta(meta, path, self.train_state, self.loader_state.loaded)
        if self.dist.rank < len(meta["rng"]):
            set_rng_state(meta["rng"][self.dist.rank])
        self.resumed_from = path
        if self.rank0:
            log.info("resumed from %s (step %d, next sample %d, world size %d -> %d)", path, self.train_state.step,
                     meta["loader"]["next_index"], meta["world_size"], self.dist.world_size)

    # -- the loop -------------------------------------------------------------------------------
    def train(self, stop_after_step: int | None = None) -> dict:
        cfg, d, ts = self.cfg, self.dist, self.train_state
        start_step = ts.step
        end_step = cfg.run.steps if stop_after_step is None else min(cfg.run.steps, stop_after_step)
        samples = SampleLog(self.run_dir, enabled=cfg.run.log_samples, writer=self.rank0, world_size=d.world_size,
                            resume_step=start_step)
        self.log_start(start_step, end_step)
        losses, step_times, last_saved = [], [], start_step
        it = iter(self.loader)
        self.model.train()
        with StopSignals() as stop:
            for step in range(start_step + 1, end_step + 1):
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    raise TrainingError(f"the loader ran out of training data at step {step}") from None
                wait_s = time.perf_counter() - t0

                lr = self.scheduler.step(step)
                loss, grad_norm = train_step(self.model, batch, self.n_micro, cfg.optimizer.grad_clip, d.device,
                                             step=step, loss_hook=self.hooks.loss)
                ok = math.isfinite(loss) and math.isfinite(grad_norm)
                if ok:
                    self.optimizer.step()
                    ts.consecutive_bad = 0
                else:
                    ts.skipped_total += 1
                    ts.consecutive_bad += 1
                self.optimizer.zero_grad(set_to_none=True)
                ts.step, ts.tokens_seen = step, ts.tokens_seen + self.global_batch * self.seq_len
                if d.device.type == "cuda":
                    torch.cuda.synchronize()
                step_s = self.last_step_s = time.perf_counter() - t0

                step_times.append(step_s)
                if step == start_step + 1:
                    self.report_memory(step)
                if step == min(end_step, start_step + ESTIMATE_AFTER_STEPS):
                    self.report_wall_time(step, end_step, step_times)

                samples.append(step, batch["indices"], d.device)
                if step % cfg.run.log_every == 0 or not ok or step == end_step:
                    self.log_step(step, loss=loss, grad_norm=grad_norm, lr=lr, wait_s=wait_s, step_s=step_s, ok=ok)
                losses.append(loss)
                if not ok:
                    self.check_bad_steps(step, loss, grad_norm)

                if cfg.eval.every and step % cfg.eval.every == 0:
                    val = evaluate(self.model, cfg, self.pub, d)
                    self.metrics.write({"kind": "eval", "step": step, "val_loss": val})
                    if self.rank0:
                        log.info("step %6d  val_loss %.4f", step, val)

                self.checkpointer.poll()
                if cfg.checkpoint.enabled and cfg.checkpoint.every and step % cfg.checkpoint.every == 0:
                    self.save(step)
                    last_saved = step
                if signum := agreed_stop_signal(stop, d):
                    self.checkpointer.wait()  # a save in flight is finished and committed, never abandoned half-written
                    latest = committed(self.run_dir)
                    raise Interrupted(signum, step, latest[-1][1] if latest else None)

        if cfg.checkpoint.enabled and last_saved != end_step and end_step > start_step:
            self.save(end_step)  # the end of the run (or of this slice of it) is always checkpointed
        self.checkpointer.wait()
        return {"start_step": start_step, "end_step": end_step, "losses": losses, "skipped_total": ts.skipped_total,
                "resumed_from": self.resumed_from}

    # -- pieces of the loop ---------------------------------------------------------------------
    def log_start(self, start_step: int, end_step: int) -> None:
        """Per rank: the memory budget term by term; rank 0: the model and the planned compute."""
        d, args, cfg = self.dist, self.args, self.cfg
        n, budget = count_params(args), self.budget
        log.info("rank %d: memory budget (%s params / %d shards = %s per rank; this rank holds %s): %s", d.rank,
                 f"{n['total']:,}", budget.shards, f"{n['total'] / budget.shards:,.0f}", f"{self.local_params:,}",
                 budget.describe())
        self.metrics.write({"kind": "budget", "step": start_step, "bytes": budget.terms, "total_bytes": budget.total,
                            "local_params": self.local_params})
        if not self.rank0:
            return
        log.info("model %s: %s parameters (%s non-embedding), %d layers, dim %d; %s; world size %d, "
                 "global batch %d x %d tokens, %d micro-batch(es) per rank", cfg.model.preset, f"{n['total']:,}",
                 f"{n['non_embedding']:,}", args.n_layers, args.dim, self.param_dtype, d.world_size,
                 self.global_batch, self.seq_len, self.n_micro)
        tokens = (end_step - start_step) * self.global_batch * self.seq_len
        plan = planned_flops(*flops_per_token_terms(args, self.seq_len), tokens)
        log.info("planned compute, steps %d..%d (%s tokens): 6ND %.3e + attention %.3e = %.3e FLOPs",
                 start_step + 1, end_step, f"{tokens:,}", plan["6ND"], plan["attention"], plan["total"])
        if self.peak is None:
            log.info("MFU: unknown peak FLOP/s for %r (not in trainer.metrics.PEAK_BF16_FLOPS); MFU is not reported",
                     device_name(d.device))

    def report_memory(self, step: int) -> None:
        """On CUDA, after the first step: the allocator's peak against the budget."""
        if self.dist.device.type != "cuda":
            return
        peak = torch.cuda.max_memory_allocated(self.dist.device)
        log.info("rank %d: after step %d, peak memory allocated %s vs budget %s (%.2fx)", self.dist.rank, step,
                 format_bytes(peak), format_bytes(self.budget.total), peak / self.budget.total)
        self.metrics.write({"kind": "memory", "step": step, "max_allocated_bytes": peak,
                            "budget_bytes": self.budget.total, "ratio": peak / self.budget.total})

    def report_wall_time(self, step: int, end_step: int, step_times: list[float]) -> None:
        """After the first steps: the measured rate (the first step, which compiles and warms the
        allocator, left out when there are others) and the wall time it implies for the rest."""
        if not self.rank0:
            return
        measured = statistics.median(step_times[1:] or step_times)
        tps = self.global_batch * self.seq_len / measured
        achieved = mfu(tps / self.dist.world_size, self.flops_per_token, self.peak)
        if achieved is None:  # no peak for this device: the measured step time alone
            rest, at = (end_step - step) * measured, "MFU unknown"
        else:
            flops = planned_flops(*flops_per_token_terms(self.args, self.seq_len),
                                  (end_step - step) * self.global_batch * self.seq_len)["total"]
            rest = expected_wall_s(flops, mfu=achieved, peak_flops_per_device=self.peak, devices=self.dist.world_size)
            at = f"MFU {100 * achieved:.1f}%"
        log.info("measured over steps ..%d: %.3f s/step, %s tokens/s, %s; expected wall time for the %d remaining "
                 "steps: %s", step, measured, f"{tps:,.0f}", at, end_step - step, format_seconds(rest))

    def log_step(self, step: int, *, loss: float, grad_norm: float, lr: float, wait_s: float, step_s: float,
                 ok: bool) -> None:
        d = self.dist
        times = [torch.zeros(1, device=d.device) for _ in range(d.world_size)]
        dist.all_gather(times, torch.tensor([step_s], device=d.device))
        tps = self.global_batch * self.seq_len / step_s
        record = {"kind": "train", "step": step, "loss": loss, "grad_norm": grad_norm, "lr": lr,
                  "tokens_seen": self.train_state.tokens_seen, "tokens_per_s": tps,
                  "tokens_per_s_per_device": tps / d.world_size,
                  "mfu": mfu(tps / d.world_size, self.flops_per_token, self.peak), "input_wait_s": wait_s,
                  "input_wait_pct": 100.0 * wait_s / step_s, "step_s": step_s,
                  "rank_step_s": [t.item() for t in times], "skipped": not ok,
                  "skipped_total": self.train_state.skipped_total}
        self.metrics.write(record)
        if self.rank0:
            log.info(format_step(record))

    def check_bad_steps(self, step: int, loss: float, grad_norm: float) -> None:
        ts, limit = self.train_state, self.cfg.optimizer.max_bad_steps
        if self.rank0:
            log.warning("step %d: non-finite loss %s or grad norm %s: optimizer step skipped (%d in a row, %d total)",
                        step, loss, grad_norm, ts.consecutive_bad, ts.skipped_total)
        if ts.consecutive_bad >= limit:
            raise TrainingError(
                f"{ts.consecutive_bad} consecutive steps (up to step {step}) had a non-finite loss or gradient norm "
                f"(optimizer.max_bad_steps={limit}); stopping. Resume from the last "
                f"checkpoint in {self.run_dir}/checkpoints with a lower optimizer.lr or a tighter grad_clip")

    def meta(self, step: int) -> dict:
        """meta.json's content for a save after optimizer step ``step``."""
        ts = self.train_state
        return new_meta(
            step=step, world_size=self.dist.world_size, global_batch=self.global_batch, seq_len=self.seq_len,
            loader=self.loader.state_dict(), manifest_sha256=self.manifest.sha256, manifest_url=self.pub.url,
            split="train", manifest_changes=self.manifest_changes, resumed_from=self.resumed_from,
            job=self.cfg.to_dict(), tokens_seen=ts.tokens_seen,
            data=data_fields(self.pub),
            scheduler=self.scheduler.describe(),
            bad_steps={"skipped_total": ts.skipped_total, "consecutive": ts.consecutive_bad},
            model_args=asdict(self.args), code_version=code_version(), versions=library_versions())

    def save(self, step: int) -> None:
        blocked_s = self.checkpointer.save(step, self.states, self.meta(step))
        interval_s = young_daly_interval_s(blocked_s, self.cfg.checkpoint.mtbf_hours * 3600)
        self.metrics.write({"kind": "checkpoint", "step": step, "blocked_s": blocked_s,
                            "young_daly_interval_s": interval_s})
        if self.rank0:
            report_interval(blocked_s, interval_s, self.cfg, self.last_step_s)


def train(cfg: JobConfig, *, stop_after_step: int | None = None, allow_manifest_change: bool = False,
          hooks: Hooks | None = None) -> dict:
    """Build the run, resume it when a checkpoint verifies, and train to ``run.steps`` (or ``stop_after_step``)."""
    with Trainer(cfg, allow_manifest_change=allow_manifest_change, hooks=hooks) as trainer:
        trainer.resume()
        return trainer.train(stop_after_step)


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
def evaluate(model, cfg: JobConfig, pub, d) -> float:
    """Mean loss over the first ``eval.batches`` batches of the validation split (same batches every time)."""
    B = cfg.eval.global_batch or cfg.data.global_batch
    if B % d.world_size:
        raise TrainingError(f"eval.global_batch={B} does not divide by the world size {d.world_size}")
    # the run's loaded data (a dataset or a mixture with its components): no manifest is read again
    val = Loader(pub, split="validation", seed=cfg.data.seed, global_batch=B, rank=d.rank, world_size=d.world_size,
                 order="sequential", cache_dir=cfg.data.cache_dir, prefetch=cfg.data.prefetch,
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


def check_states_match_meta(meta: dict, path: str, train_state: TrainState, loader_state: dict | None) -> None:
    """The step and loader position restored from the DCP state must be meta.json's: the check
    verify runs too (trainer.checkpoint.compare_states), here on the states as loaded."""
    compare_states(meta, path, train_state.step, loader_state)


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
