"""The training run: ``Trainer`` builds it (process group, data, model, optimizer, loader,
checkpointer), ``resume()`` loads the newest checkpoint that verifies, and ``train()`` is the loop,
which reads top to bottom: next batch, schedule, forward/backward, optimizer step (or a skipped
bad step), logging, evaluation, checkpoint, stop signal. The commands are gristmill/cli/train.py.

One optimizer step n (1-based) consumes the loader's step n-1, i.e. the global sample indices
[(n-1)*B, n*B) of the manifest's training order, split across ranks by the loader. Checkpoint
``step-N`` therefore holds the model after samples [0, N*B) and the loader's next index N*B.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import asdict, replace

import torch
import torch.distributed as dist

from gristmill.loader import Batches, Caching, Loader, Sampling, Source, Threads, open_data
from gristmill.manifests import code_version

from .budget import available_bytes, check_fits, memory_budget
from .cadence import Cadence, job_mtbf_s
from .cadence import describe as describe_cadence
from .checkpoint import Checkpointer, library_versions, set_rng_state
from .checkpoint_store import RUN_FILES
from .config import TrainConfig
from .errors import CheckpointError, Interrupted, TrainingError
from .evaluate import evaluate
from .hooks import Hooks
from .meta import data_fields, new_meta, run_record
from .metrics import MetricsLog, device_name, peak_flops
from .model import count_params, flops_per_token, model_args
from .optim import build_optimizer
from .parallelize import build_mesh, build_model, init_distributed, resolve_attention, resolve_mixed_precision
from .resume import check_model_args, check_resume, check_states_match_meta
from .rank_stats import StragglerRule, WindowStats, gather_hostnames
from .rewind import on_spike
from .run_log import RunLog
from .sample_log import SampleLog
from .skips import record as skip_record
from .spikes import SpikeDetector
from .signals import StopSignals
from .state import LoaderState, ModelState, OptimizerState, TrainState, WarmupCosine
from .step import local_batch_sizes, train_step
from .watchdog import Watchdog, group_timeout_s

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
        self.dist = d = init_distributed(group_timeout_s(cfg.run.hang_timeout_s))
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

        self.checkpointer = build_checkpointer(cfg, d, self.hooks)
        self.manifest_changes: list[dict] = []
        self.bad_limit_step: int | None = None  # the step at which optimizer.max_bad_steps was reached
        self.skips: list[dict] = []  # samples trained on by no update (trainer/skips.py), carried in every meta.json
        self.spikes = SpikeDetector(cfg.spikes) if cfg.spikes is not None else None
        self.rewinds = 0
        self.resumed_from: str | None = None
        self.flops_per_token = flops_per_token(self.args, self.seq_len)
        self.peak = peak_flops(device_name(d.device))
        self.last_step_s: float | None = None
        self.run_log = RunLog(self)
        hostnames = gather_hostnames(d.world_size)  # once: the run record and the straggler rule name every rank's host
        self.run_record = run_record(device_name=device_name(d.device), tokenizer_sha256=self.manifest.tokenizer.sha256,
                                     hostnames=hostnames)
        # every rank's timings, gathered at each train record (trainer/rank_stats.py)
        self.window = WindowStats(self.model, d.device)
        self.stragglers = StragglerRule(cfg.run.straggler_fraction, cfg.run.straggler_windows,
                                        hostnames)
        self.watchdog = Watchdog(cfg.run.hang_timeout_s, d.rank)

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
        self.watchdog.close()
        self.loader.close()  # its prefetch threads must not outlive the run, whatever ended it
        self.metrics.close()

    # -- resume ---------------------------------------------------------------------------------
    def resume(self) -> None:
        """Load the newest checkpoint that verifies; its manifest must match unless overridden."""
        if not (self.cfg.checkpoint.enabled and self.cfg.checkpoint.resume):
            return
        self.watchdog.arm(0, "resume")
        path, meta = self.checkpointer.latest()
        if path is None:
            return self.watchdog.disarm()
        self.manifest_changes = check_resume(meta, path, self.pub, self.cfg, self.allow_manifest_change)
        check_model_args(meta, path, self.args)
        self.loader_state.manifest_sha256 = self.manifest.sha256  # a change was allowed, or there is none
        self.checkpointer.load(path, self.states, meta)
        check_states_match_meta(meta, path, self.train_state, self.loader_state.loaded)
        self.skips = list(meta.get("skips") or [])
        if self.dist.rank < len(meta["rng"]):
            set_rng_state(meta["rng"][self.dist.rank])
        self.resumed_from = self.checkpointer.source_of(path)
        self.watchdog.disarm()
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
        pending: list[tuple] = []  # (step, lr, loss, grad norm, finite, next index) not yet read on the host
        it = self.batches(step=start_step, end_step=end_step)
        self.model.train()
        with StopSignals() as stop, self.saves_committed_on_stop():
            step = start_step
            while step < end_step:
                step += 1
                self.watchdog.arm(step, "training step")
                self.window.begin_step()
                t0 = time.perf_counter()
                batch = self.next_batch(it, step)
                wait_s = time.perf_counter() - t0

                lr = self.scheduler.step(step)
                loss, grad_norm = train_step(self.model, batch, self.n_micro, cfg.optimizer.grad_clip, d.device,
                                             step=step, loss_hook=self.hooks.loss)
                finite = self.optimizer_step(loss, grad_norm)
                ts.step, ts.tokens_seen = step, ts.tokens_seen + self.global_batch * self.seq_len
                step_s = time.perf_counter() - t0  # the host's; on GPU the record reads CUDA events
                self.window.end_step(wait_s, step_s)
                pending.append((step, lr, loss, grad_norm, finite, self.loader.next_index))

                step_times.append(step_s)
                if step <= start_step + 2:  # step 2: the first with the optimizer state live in forward
                    self.run_log.report_memory(step)
                if step == min(end_step, start_step + ESTIMATE_AFTER_STEPS):
                    self.run_log.report_wall_time(step, end_step, step_times)
                samples.append(step, batch["indices"], d.device)
                windows = None
                at_record = step % cfg.run.log_every == 0 or step == end_step
                # a record reads the window's values (the only host syncs); the spike detector needs every
                # step's loss, so with a spikes: section each step is read (one sync a step)
                values = self.settle(pending) if at_record or self.spikes else []
                losses += [v[0] for v in values]
                if at_record:
                    windows = self.window.gather(d.world_size, stop.signum)
                    self.run_log.log_step(step, values[-1], lr=lr, windows=windows)
                self.check_bad_steps()
                if self.spikes and values[-1][2] and (spike := self.spikes.check(step, values[-1][0], values[-1][1])) \
                        and on_spike(self, spike):
                    it.close()  # rewound (trainer/rewind.py): on from the checkpoint's step, past the skipped samples
                    step, it = ts.step, self.batches(step=ts.step, end_step=end_step)
                    continue

                if cfg.eval.every and step % cfg.eval.every == 0:
                    self.watchdog.arm(step, "evaluation")
                    self.evaluate(step)

                self.checkpointer.poll()
                if self.checkpointer.due(step):
                    losses += [v[0] for v in self.settle(pending)]  # meta.json's bad-step counts are exact
                    self.check_bad_steps()
                    self.watchdog.arm(step, "checkpoint save")
                    self.save(step)
                if signum := (stop.signum if d.world_size == 1 else stop.agreed(windows)):
                    self.checkpointer.wait()  # a save in flight is finished and committed, never abandoned half-written
                    raise Interrupted(signum, step, self.checkpointer.newest())

        self.watchdog.arm(end_step, "final checkpoint save")
        if self.checkpointer.due_at_end(end_step):
            self.save(end_step)
        self.checkpointer.wait()
        self.watchdog.disarm()
        return {"start_step": start_step, "end_step": end_step, "losses": losses, "skipped_total": ts.skipped_total,
                "resumed_from": self.resumed_from}

    # -- pieces of the loop ---------------------------------------------------------------------
    @contextlib.contextmanager
    def saves_committed_on_stop(self):
        """A stop every rank decides alike (bad steps, a spike's ``stop``, the data's end) first commits
        the save in flight: its message says to resume from the last checkpoint, which a process
        exiting mid-upload would leave uncommitted. (An interrupt waits for it itself; any other
        error, a lost rank's, may mean a commit that can never finish.)"""
        try:
            yield
        except TrainingError as e:
            if not isinstance(e, Interrupted):
                try:
                    self.checkpointer.wait()
                except CheckpointError as ce:  # the stop's own message stays the error; this one is logged
                    log.error("%s", ce)
            raise

    def batches(self, step: int, end_step: int):
        """The loader's batches after ``step``, up to ``end_step``'s: its end set there, so no batch past the
        run's end is fetched (a served loader asks for ranges of steps ahead; issue 41)."""
        self.loader.end_at(self.loader.next_index + (end_step - step) * self.global_batch)
        return iter(self.loader)

    def next_batch(self, it, step: int) -> dict:
        if self.hooks.data is not None:
            self.hooks.data(step)
        try:
            return next(it)
        except StopIteration:
            raise TrainingError(f"the loader ran out of training data at step {step}") from None

    def optimizer_step(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """Step the optimizer unless the loss or gradient norm is not finite (a skipped bad step),
        decided on the device: the fused AdamW skips its update inside the kernel when
        ``found_inf`` is set (as AMP's GradScaler uses it), so no step waits for the host to read
        a flag. Both values are global (all-reduced), so every rank decides alike. Returns the
        step's flag (a device bool), read with the rest at the next record or save."""
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        self.optimizer.found_inf = (~finite).float()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return finite

    def settle(self, pending: list[tuple]) -> list[tuple]:
        """Read the pending steps' losses, norms and flags (one host sync) and account for the
        skipped ones: train_state's counts, a warning and a record each (as they were when every
        step was read). Returns [(loss, grad norm, ok, step, lr)] in step order and empties ``pending``."""
        if not pending:
            return []
        ts, limit = self.train_state, self.cfg.optimizer.max_bad_steps
        read = torch.stack([torch.stack((p[2], p[3], p[4].float())) for p in pending]).tolist()
        values = [(loss, norm, ok == 1.0, p[0], p[1]) for (loss, norm, ok), p in zip(read, pending)]
        ends = [p[5] for p in pending]
        pending.clear()
        for (loss, norm, ok, step, lr), end in zip(values, ends):
            if ok:
                ts.consecutive_bad = 0
                continue
            # this step's samples trained nothing: recorded, the audit leaves them out (trainer/skips.py)
            self.skips.append(skip_record("bad_step", end - self.global_batch, end, step, "non-finite loss or grad norm"))
            ts.skipped_total += 1
            ts.consecutive_bad += 1
            if ts.consecutive_bad >= limit and self.bad_limit_step is None:
                self.bad_limit_step = step
            if self.rank0:
                log.warning("step %d: non-finite loss %s or grad norm %s: optimizer step skipped (%d in a row, %d total)",
                            step, loss, norm, ts.consecutive_bad, ts.skipped_total)
            if step != values[-1][3]:  # the last one is written by its record (or is not at a record)
                self.metrics.write({"kind": "train", "step": step, "loss": loss, "grad_norm": norm, "lr": lr,
                                    "skipped": True, "skipped_total": ts.skipped_total})
        return values

    def evaluate(self, step: int) -> None:
        val = evaluate(self.model, self.cfg, self.pub, self.dist, self.loader.source)
        self.metrics.write({"kind": "eval", "step": step, "val_loss": val})
        if self.rank0:
            log.info("step %6d  val_loss %.4f", step, val)

    def check_bad_steps(self) -> None:
        """Stop when ``optimizer.max_bad_steps`` steps in a row were skipped (seen at a record or
        before a save: up to ``run.log_every`` - 1 steps after the one that reached the limit)."""
        step, ts, limit = self.bad_limit_step, self.train_state, self.cfg.optimizer.max_bad_steps
        if step is None:
            return
        raise TrainingError(
            f"{limit} consecutive steps (up to step {step}) had a non-finite loss or gradient norm "
            f"(optimizer.max_bad_steps={limit}); stopping. Resume from the last "
            f"checkpoint in {self.cfg.checkpoint_dir()} with a lower optimizer.lr or a tighter grad_clip")

    def meta(self, step: int) -> dict:
        """meta.json's content for a save after optimizer step ``step``."""
        ts = self.train_state
        return new_meta(
            step=step, world_size=self.dist.world_size, global_batch=self.global_batch, seq_len=self.seq_len,
            loader=self.loader.state_dict(), manifest_sha256=self.manifest.sha256, manifest_url=self.pub.url,
            split="train", manifest_changes=self.manifest_changes, resumed_from=self.resumed_from, skips=self.skips,
            job=self.cfg.content_dict(), tokens_seen=ts.tokens_seen, run_record=self.run_record,
            data=data_fields(self.pub),
            scheduler=self.scheduler.describe(),
            bad_steps={"skipped_total": ts.skipped_total, "consecutive": ts.consecutive_bad},
            model_args=asdict(self.args), code_version=code_version(), versions=library_versions())

    def save(self, step: int) -> None:
        """Save (the local write; the upload runs on), then measure: the cadence's inputs are the slowest
        rank's, so every rank plans the same next save (trainer/cadence.py)."""
        times = self.checkpointer.save(step, self.states, self.meta(step))
        slowest = torch.tensor([times["blocked_s"], self.last_step_s or 0.0], dtype=torch.float64, device=self.dist.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        blocked_s, step_s = slowest.tolist()
        record = self.checkpointer.cadence.measured(step, blocked_s, step_s or blocked_s)
        self.metrics.write({"kind": "checkpoint", "step": step, "blocked_s": blocked_s, "waited_s": times["waited_s"],
                            "two_tier": self.checkpointer.two_tier, **record})
        if self.rank0:
            log.info("checkpoint step-%d: training blocked %.3f s (%.3f s of it waiting for the previous upload); %s",
                     step, blocked_s, times["waited_s"], describe_cadence(record))


def build_checkpointer(cfg: TrainConfig, d, hooks: Hooks) -> Checkpointer:
    """The run's checkpointer: two tiers (local_dir, then checkpoint.dir), the cadence from the job's MTBF."""
    c = cfg.checkpoint
    cadence = Cadence(c.every, mtbf_s=job_mtbf_s(c.device_mtbf_hours, d.world_size, c.mtbf_hours),
                      first_steps=c.auto_first_steps)
    return Checkpointer(cfg.checkpoint_dir(), local_dir=cfg.checkpoint_local_dir(), storage_options=c.storage_options,
                        keep=c.keep, keep_every=c.keep_every, async_save=c.async_save, rank=d.rank,
                        world_size=d.world_size, device=d.device, local_rank=d.local_rank,
                        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), hooks=hooks, enabled=c.enabled,
                        cadence=cadence, run_files=tuple(os.path.join(cfg.run.dir, name) for name in RUN_FILES))


def train(cfg: TrainConfig, *, stop_after_step: int | None = None, allow_manifest_change: bool = False,
          hooks: Hooks | None = None) -> dict:
    """Build the run, resume it when a checkpoint verifies, and train to ``run.steps`` (or ``stop_after_step``)."""
    with Trainer(cfg, allow_manifest_change=allow_manifest_change, hooks=hooks) as trainer:
        trainer.resume()
        return trainer.train(stop_after_step)
