"""What a run tells as it goes: the memory budget and planned compute at the start, each train
record (metrics.jsonl and the log line, with every rank's timings and the straggler rule), the
allocator's peak after the first step, the expected wall time after the first few (each save's
cadence: trainer/cadence.py)."""
from __future__ import annotations

import logging
import statistics

import torch

from .budget import expected_wall_s, format_bytes, format_seconds, planned_flops
from .metrics import device_name, format_step, mfu
from .model import count_params, flops_per_token_terms
from .rank_stats import rank_fields

log = logging.getLogger("gristmill.trainer")


class RunLog:
    """The reporting of one ``Trainer`` (it reads the trainer's model shape, budget and state)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def log_start(self, start_step: int, end_step: int) -> None:
        """Per rank: the memory budget term by term; rank 0: the model and the planned compute."""
        t = self.trainer
        d, args, cfg = t.dist, t.args, t.cfg
        n, budget = count_params(args), t.budget
        log.info("rank %d: memory budget (%s params / %d shards = %s per rank; this rank holds %s): %s", d.rank,
                 f"{n['total']:,}", budget.shards, f"{n['total'] / budget.shards:,.0f}", f"{t.local_params:,}",
                 budget.describe())
        t.metrics.write({"kind": "budget", "step": start_step, "bytes": budget.terms, "total_bytes": budget.total,
                         "local_params": t.local_params})
        if not t.rank0:
            return
        log.info("model %s: %s parameters (%s non-embedding), %d layers, dim %d; %s; world size %d, "
                 "global batch %d x %d tokens, %d micro-batch(es) per rank", cfg.model.preset, f"{n['total']:,}",
                 f"{n['non_embedding']:,}", args.n_layers, args.dim, t.param_dtype, d.world_size,
                 t.global_batch, t.seq_len, t.n_micro)
        tokens = (end_step - start_step) * t.global_batch * t.seq_len
        plan = planned_flops(*flops_per_token_terms(args, t.seq_len), tokens)
        log.info("planned compute, steps %d..%d (%s tokens): 6ND %.3e + attention %.3e = %.3e FLOPs",
                 start_step + 1, end_step, f"{tokens:,}", plan["6ND"], plan["attention"], plan["total"])
        if t.peak is None:
            log.info("MFU: unknown peak FLOP/s for %r (not in trainer.metrics.PEAK_BF16_FLOPS); MFU is not reported",
                     device_name(d.device))

    def report_memory(self, step: int) -> None:
        """On CUDA, after each of the first two steps: the allocator's peak against the budget, and
        what stays allocated between steps (weights and optimizer state). Step 1's peak misses the
        Adam moments, which AdamW creates in its first ``step()``, after backward has freed the
        activations; from step 2 on they are live during forward, so step 2's is the run's peak."""
        t = self.trainer
        if t.dist.device.type != "cuda":
            return
        peak, held = torch.cuda.max_memory_allocated(t.dist.device), torch.cuda.memory_allocated(t.dist.device)
        log.info("rank %d: after step %d, peak memory allocated %s vs budget %s (%.2fx); %s held between steps",
                 t.dist.rank, step, format_bytes(peak), format_bytes(t.budget.total), peak / t.budget.total,
                 format_bytes(held))
        t.metrics.write({"kind": "memory", "step": step, "max_allocated_bytes": peak, "allocated_bytes": held,
                         "budget_bytes": t.budget.total, "ratio": peak / t.budget.total})

    def report_wall_time(self, step: int, end_step: int, step_times: list[float]) -> None:
        """After the first steps: the measured rate (the first step, which compiles and warms the
        allocator, left out when there are others) and the wall time it implies for the rest."""
        t = self.trainer
        if not t.rank0:
            return
        measured = statistics.median(step_times[1:] or step_times)
        tps = t.global_batch * t.seq_len / measured
        achieved = mfu(tps / t.dist.world_size, t.flops_per_token, t.peak)
        if achieved is None:  # no peak for this device: the measured step time alone
            rest, at = (end_step - step) * measured, "MFU unknown"
        else:
            flops = planned_flops(*flops_per_token_terms(t.args, t.seq_len),
                                  (end_step - step) * t.global_batch * t.seq_len)["total"]
            rest = expected_wall_s(flops, mfu=achieved, peak_flops_per_device=t.peak, devices=t.dist.world_size)
            at = f"MFU {100 * achieved:.1f}%"
        log.info("measured over steps ..%d: %.3f s/step, %s tokens/s, %s; expected wall time for the %d remaining "
                 "steps: %s", step, measured, f"{tps:,.0f}", at, end_step - step, format_seconds(rest))

    def log_step(self, step: int, value: tuple, *, lr: float, windows: list[dict]) -> None:
        """The train record of ``step``: its loss, norm and flag (``value``, read by Trainer.settle)
        and every rank's timings over the window since the last record (``windows``, gathered by
        trainer/rank_stats.py; times are means per step over the window). Rank 0 writes it; every
        rank runs the straggler rule alike."""
        t = self.trainer
        d = t.dist
        loss, grad_norm, ok = value[:3]
        ranks = rank_fields(windows)
        mine = windows[d.rank]
        n = max(1, mine["steps"])
        step_s, wait_s = mine["step_sum"] / n, mine["input_wait_sum"] / n
        t.last_step_s = step_s
        tps = t.global_batch * t.seq_len / step_s
        record = {"kind": "train", "step": step, "loss": loss, "grad_norm": grad_norm, "lr": lr,
                  "tokens_seen": t.train_state.tokens_seen, "tokens_per_s": tps,
                  "tokens_per_s_per_device": tps / d.world_size,
                  "mfu": mfu(tps / d.world_size, t.flops_per_token, t.peak), "input_wait_s": wait_s,
                  "input_wait_pct": 100.0 * wait_s / step_s, "step_s": step_s, **ranks, "skipped": not ok,
                  "skipped_total": t.train_state.skipped_total}
        stragglers = t.stragglers.update(ranks)
        if stragglers:
            record["stragglers"] = [s["rank"] for s in stragglers]
        t.metrics.write(record)
        for s in stragglers:
            t.metrics.write({"kind": "straggler", "step": step, **s})
        if t.rank0:
            log.info(format_step(record))
            for s in stragglers:
                log.warning("straggler: rank %d on host %s took %.3f s per step of its own (step time less its "
                            "collective wait) against the median rank's %.3f s, %d windows in a row "
                            "(run.straggler_fraction=%g); its input wait: %.3f s per step", s["rank"], s["host"],
                            s["own_step_s"], s["median_own_step_s"], s["windows"], t.cfg.run.straggler_fraction,
                            s["input_wait_s"])

