"""The training run: ``Trainer`` builds it (process group, data, model, optimizer, loader,
checkpointer), ``resume()`` loads the newest checkpoint that verifies, and ``train()`` is the loop,
which reads top to bottom: next batch, schedule, forward/backward, optimizer step (or a skipped
bad step), logging, evaluation, checkpoint, stop signal. The commands are gristmill/cli/train.py.

One optimizer step n (1-based) consumes the loader's step n-1, i.e. the global sample indices
[(n-1)*B, n*B) of the manifest's training order, split across ranks by the loader. Checkpoint
``step-N`` therefore holds the model after samples [0, N*B) and the loader's next index N*B.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, replace

import torch

from gristmill.loader import Batches, Caching, Loader, Sampling, Source, Threads, open_data
from gristmill.manifests import code_version

from .budget import available_bytes, check_fits, memory_budget
from .checkpoint import Checkpointer, committed, library_versions, set_rng_state
from .config import TrainConfig
from .errors import Interrupted, TrainingError
from .evaluate import evaluate
from .hooks import Hooks
from .meta import data_fields, new_meta
from .metrics import MetricsLog, device_name, peak_flops, young_daly_interval_s
from .model import count_params, flops_per_token, model_args
from .optim import build_optimizer
from .parallelize import build_mesh, build_model, init_distributed, resolve_attention, resolve_mixed_precision
from .resume import check_model_args, check_resume, check_states_match_meta
from .run_log import RunLog, report_interval
from .sample_log import SampleLog
from .signals import StopSignals
from .state import LoaderState, ModelState, OptimizerState, TrainState, WarmupCosine
from .step import local_batch_sizes, train_step

log = logging.getLogger("gristmill.trainer")

ESTIMATE_AFTER_STEPS = 5  # steps measured before the expected wall time is printed


class Trainer:
    """One training run, built in reading order: process group, data, model (sharded), optimizer,
    schedule, loader, then the state a checkpoint holds (``self.states``: model, optimizer,
    scheduler, loader and train state, each DCP ``Stateful``, see trainer/state.py).
    ``resume()`` loads the newest checkpoint that verifies; ``train()`` is the loop; ``close()``
    stops the loader's threads (a ``with`` block calls it)."""

    def __init__(self, cfg: TrainConfig, *, allow_manifest_change: bool = False, hooks: Hooks | None = None):
        self.cfg, self.hooks = cfg, hooks or Hooks()
        self.allow_manifest_change = allow_manifest_change or cfg.checkpoint.allow_manifest_change
        self.dist = d = init_distributed()
        self.rank0 = d.rank == 0
        self.run_dir = cfg.run.dir
        os.makedirs(self.run_dir, exist_ok=True)

        # Data: the manifest pins vocabulary, sequence length and the content hash the checkpoint records.
        # the loader's source: the store, or `gristmill serve` endpoints (data.service)
        self.source = Source(expected_sha256=cfg.data.expected_sha256, service=tuple(cfg.data.service),
                             service_token_file=cfg.data.service_token_file, service_tls_root=cfg.data.service_tls_root,
                             service_tls_cert=cfg.data.service_tls_cert, service_tls_key=cfg.data.service_tls_key,
                             service_deadline_s=cfg.data.service_deadline_s)
        self.pub = open_data(cfg.data.manifest, self.source)  # a dataset or a mixture
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
        # [inputs, issue 26] the budget before any allocation: a run that cannot fit is one ConfigError
        self.budget = memory_budget(self.args, n_params=count_params(self.args)["total"],
                                    shards=self.mesh.size(-1),  # the FSDP degree; HSDP replicas hold the same shards
                                    compute_bytes=torch.tensor([], dtype=self.param_dtype).element_size(),
                                    micro_batch=cfg.data.micro_batch or self.global_batch // d.world_size,
                                    seq_len=self.seq_len, activation_checkpoint=cfg.parallelism.activation_checkpoint)
        check_fits(self.budget, *available_bytes(d.device))
        self.model = build_model(self.args, self.mesh, device=d.device, seed=cfg.run.seed, param_dtype=self.param_dtype,
                                 activation_checkpoint=cfg.parallelism.activation_checkpoint,
                                 compile=cfg.parallelism.compile)
        self.optimizer = build_optimizer(self.model, cfg.optimizer, d.device)
        self.local_params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                                for p in self.model.parameters())
        self.scheduler = WarmupCosine(self.optimizer, cfg.optimizer, cfg.run.steps)

        self.checkpointer = Checkpointer(self.run_dir, keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save,
                                         rank=d.rank, world_size=d.world_size, device=d.device,
                                         before_commit=self.hooks.before_commit, enabled=cfg.checkpoint.enabled,
                                         every=cfg.checkpoint.every)
        self.manifest_changes: list[dict] = []
        self.resumed_from: str | None = None
        self.flops_per_token = flops_per_token(self.args, self.seq_len)
        self.peak = peak_flops(device_name(d.device))
        self.last_step_s: float | None = None
        self.run_log = RunLog(self)

        # Last, the two that hold threads and files (close() releases them). Always gristmill's
        # Loader: the audit answers from its pure order, so no other loader may stand in.
        self.metrics = MetricsLog(self.run_dir, enabled=self.rank0, tensorboard=cfg.run.tensorboard)
        self.loader = Loader(self.pub, Sampling(split="train", seed=cfg.data.seed, global_batch=self.global_batch,
                                                rank=d.rank, world_size=d.world_size, order=cfg.data.order),
                             source=replace(self.source, expected_sha256=self.manifest.sha256),
                             caching=Caching(dir=cfg.data.cache_dir),
                             threads=Threads(prefetch=cfg.data.prefetch),
                             batches=Batches(token_dtype=None, documents=cfg.model.document_mask))  # position ids: document mask
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
        self.run_log.log_start(start_step, end_step)
        losses, step_times = [], []
        it = iter(self.loader)
        self.model.train()
        with StopSignals() as stop:
            for step in range(start_step + 1, end_step + 1):
                t0 = time.perf_counter()
                batch = self.next_batch(it, step)
                wait_s = time.perf_counter() - t0

                lr = self.scheduler.step(step)
                loss, grad_norm = train_step(self.model, batch, self.n_micro, cfg.optimizer.grad_clip, d.device,
                                             step=step, loss_hook=self.hooks.loss)
                ok = self.optimizer_step(loss, grad_norm)
                ts.step, ts.tokens_seen = step, ts.tokens_seen + self.global_batch * self.seq_len
                if d.device.type == "cuda":
                    torch.cuda.synchronize()
                step_s = self.last_step_s = time.perf_counter() - t0

                step_times.append(step_s)
                if step <= start_step + 2:  # step 2: the first with the optimizer state live in forward
                    self.run_log.report_memory(step)
                if step == min(end_step, start_step + ESTIMATE_AFTER_STEPS):
                    self.run_log.report_wall_time(step, end_step, step_times)
                samples.append(step, batch["indices"], d.device)
                if step % cfg.run.log_every == 0 or not ok or step == end_step:
                    self.run_log.log_step(step, loss=loss, grad_norm=grad_norm, lr=lr, wait_s=wait_s, step_s=step_s,
                                          ok=ok)
                losses.append(loss)
                if not ok:
                    self.check_bad_steps(step, loss, grad_norm)

                if cfg.eval.every and step % cfg.eval.every == 0:
                    self.evaluate(step)

                self.checkpointer.poll()
                if self.checkpointer.due(step):
                    self.save(step)
                if signum := stop.agreed(d):
                    self.checkpointer.wait()  # a save in flight is finished and committed, never abandoned half-written
                    latest = committed(self.run_dir)
                    raise Interrupted(signum, step, latest[-1][1] if latest else None)

        if self.checkpointer.due_at_end(end_step):
            self.save(end_step)
        self.checkpointer.wait()
        return {"start_step": start_step, "end_step": end_step, "losses": losses, "skipped_total": ts.skipped_total,
                "resumed_from": self.resumed_from}

    # -- pieces of the loop ---------------------------------------------------------------------
    def next_batch(self, it, step: int) -> dict:
        try:
            return next(it)
        except StopIteration:
            raise TrainingError(f"the loader ran out of training data at step {step}") from None

    def optimizer_step(self, loss: float, grad_norm: float) -> bool:
        """Step the optimizer unless the loss or gradient norm is not finite (a skipped bad step)."""
        ts = self.train_state
        ok = math.isfinite(loss) and math.isfinite(grad_norm)
        if ok:
            self.optimizer.step()
            ts.consecutive_bad = 0
        else:
            ts.skipped_total += 1
            ts.consecutive_bad += 1
        self.optimizer.zero_grad(set_to_none=True)
        return ok

    def evaluate(self, step: int) -> None:
        val = evaluate(self.model, self.cfg, self.pub, self.dist, self.loader.source)
        self.metrics.write({"kind": "eval", "step": step, "val_loss": val})
        if self.rank0:
            log.info("step %6d  val_loss %.4f", step, val)

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


def train(cfg: TrainConfig, *, stop_after_step: int | None = None, allow_manifest_change: bool = False,
          hooks: Hooks | None = None) -> dict:
    """Build the run, resume it when a checkpoint verifies, and train to ``run.steps`` (or ``stop_after_step``)."""
    with Trainer(cfg, allow_manifest_change=allow_manifest_change, hooks=hooks) as trainer:
        trainer.resume()
        return trainer.train(stop_after_step)
