"""What the trainer does about a loss spike (trainer/spikes.py finds it): log it, stop, or rewind
to the newest checkpoint before it and skip samples, recording the skip so the audit stays exact.

A rewind reloads every state of checkpoint ``step-C`` (model, optimizer, schedule, loader, train
state, RNG) and moves the loader from that checkpoint's next index ``N_C`` to ``end``: the samples
of the next ``spikes.skip_steps`` steps (PaLM's and OPT's remedy), and at least those of the spike's
own window (steps C+1..S, the spike included). ``[N_C, end)`` becomes a ``rewind`` record in
``Trainer.skips`` (trainer/skips.py), which every later checkpoint's meta.json carries; the skips
recorded after ``step-C`` (an earlier rewind to it, bad steps after it) lie inside the new range
and are dropped with the steps they belonged to. Every rank sees the same global loss, so every
rank takes the same decision; ``Checkpointer.latest`` and ``load`` are collective.
"""
from __future__ import annotations

import logging

from .checkpoint import set_rng_state
from .errors import TrainingError
from .resume import check_states_match_meta
from .skips import record
from .spikes import Spike

log = logging.getLogger("gristmill.trainer")


def on_spike(trainer, spike: Spike) -> bool:
    """Record and act on ``spike``; True when the run was rewound (the loop continues after the
    checkpoint's step with a fresh loader iterator)."""
    cfg = trainer.cfg.spikes
    action = cfg.action
    if action == "rewind_skip" and trainer.rewinds >= cfg.max_rewinds:
        action = "stop"
    trainer.metrics.write({"kind": "spike", "step": spike.step, "metric": spike.metric, "value": spike.value,
                           "mean": spike.mean, "spread": spike.spread, "z": spike.z, "action": action})
    if trainer.rank0:
        log.warning("%s; action: %s", spike.describe(), action)
    if action == "log":
        return False
    run = trainer.run_dir
    if action == "stop":
        why = (f" ({trainer.rewinds} rewinds already, spikes.max_rewinds={cfg.max_rewinds})"
               if cfg.action == "rewind_skip" else "")
        raise TrainingError(f"{spike.describe()}; stopping (spikes.action={cfg.action}){why}. See its documents with "
                            f"`gristmill audit steps {run} --steps {max(1, spike.step - 2)}:{spike.step}` after the next "
                            f"checkpoint, or resume with spikes.action=rewind_skip")
    rewind_skip(trainer, spike)
    return True


def rewind_skip(trainer, spike: Spike) -> None:
    cfg, B = trainer.cfg.spikes, trainer.global_batch
    trainer.checkpointer.wait()  # a save in flight is committed first: it may be the one to rewind to
    path, meta = trainer.checkpointer.latest()
    if path is None or meta["step"] >= spike.step:
        raise TrainingError(f"{spike.describe()}; spikes.action=rewind_skip needs a checkpoint before step {spike.step} "
                            f"in {trainer.run_dir}/checkpoints and there is none: set checkpoint.every below the "
                            f"spikes.warmup_steps, or use spikes.action=stop")
    reached = trainer.loader.next_index  # the end of the spike's own window
    trainer.checkpointer.load(path, trainer.states, meta)
    check_states_match_meta(meta, path, trainer.train_state, trainer.loader_state.loaded)
    if trainer.dist.rank < len(meta.get("rng", [])):
        set_rng_state(meta["rng"][trainer.dist.rank])
    start = int(meta["loader"]["next_index"])
    end = max(reached, start + cfg.skip_steps * B)
    trainer.skips = list(meta.get("skips") or []) + [
        record("rewind", start, end, spike.step, f"{spike.metric} spike (z {spike.z:.1f})", after_step=int(meta["step"]))]
    trainer.loader.load_state_dict({**trainer.loader.state_dict(), "next_index": end})
    trainer.rewinds += 1
    trainer.metrics.write({"kind": "rewind", "step": spike.step, "to_step": int(meta["step"]), "skip_start": start,
                           "skip_end": end, "checkpoint": path})
    if trainer.rank0:
        log.warning("rewound to %s (step %d); skipping samples [%d, %d) (%d steps' worth)", path, meta["step"], start,
                    end, (end - start) // B)
