"""Loss-spike detection: the loss (and optionally the gradient norm) against its own running
mean, in units of its running spread (torch-free).

Each watched value keeps a running level and trend (its forecast, "the running mean") and the
running variance of the forecast's errors (horizon ``ema_steps``; :class:`RunningStat`). After
``warmup_steps`` values, one that exceeds the forecast by more than ``z`` spreads is a spike; a spike
never feeds the statistics (the next step is compared with the run before it, not with the
spike). Only rises count: a loss that falls faster than usual is no problem. The spread is at
least ``min_spread`` x the mean, so a loss flat to four digits does not turn noise into spikes.
What the trainer does about one (log, stop, rewind and skip) is trainer/train.py's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Spike:
    step: int
    metric: str  # "loss" or "grad_norm"
    value: float
    mean: float
    spread: float
    z: float

    def describe(self) -> str:
        return (f"{self.metric} spike at step {self.step}: {self.value:.4g} is {self.z:.1f} spreads above its running "
                f"mean {self.mean:.4g} (spread {self.spread:.3g})")


class RunningStat:
    """A series' running level and trend (Holt's linear exponential smoothing, both with weight
    1/ema_steps) and the exponentially weighted variance of its one-step forecast errors. The trend
    matters: early in a run the loss falls fast, and a plain running mean lags it by more than the
    noise, which would hide a spike (or, on the way down, flag nothing ever). The variance starts
    counting at ``spread_from`` values, so the steep first steps do not set the spread for long."""

    def __init__(self, ema_steps: int, spread_from: int = 2):
        self.alpha, self.spread_from = 1.0 / ema_steps, max(2, spread_from)
        self.n, self.level, self.trend, self.var, self.errors = 0, 0.0, 0.0, 0.0, 0

    @property
    def mean(self) -> float:
        """The forecast of the next value."""
        return self.level + self.trend

    def update(self, x: float) -> None:
        a = self.alpha
        if self.n == 0:
            self.level = x
        else:
            forecast, err = self.mean, x - self.mean
            if self.n >= self.spread_from:
                self.var = (1 - a) * (self.var + a * err * err) if self.errors else err * err
                self.errors += 1
            previous, self.level = self.level, a * x + (1 - a) * forecast
            self.trend = a * (self.level - previous) + (1 - a) * self.trend
        self.n += 1


class SpikeDetector:
    """``check(step, loss, grad_norm)`` -> the first spike among the watched values, or None."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.watched = {"loss": cfg.loss_z}
        if cfg.grad_norm_z is not None:
            self.watched["grad_norm"] = cfg.grad_norm_z
        self.stats = {name: RunningStat(cfg.ema_steps, cfg.warmup_steps // 2) for name in self.watched}

    def check(self, step: int, loss: float, grad_norm: float) -> Spike | None:
        values = {"loss": loss, "grad_norm": grad_norm}
        spikes = [s for name, z in self.watched.items() if (s := self._test(step, name, values[name], z))]
        if spikes:
            return spikes[0]
        for name in self.watched:
            if math.isfinite(values[name]):
                self.stats[name].update(values[name])
        return None

    def _test(self, step: int, name: str, x: float, z: float) -> Spike | None:
        st = self.stats[name]
        if st.n < max(self.cfg.warmup_steps, 2) or st.errors < 2 or not math.isfinite(x):
            return None  # non-finite values are the bad-step check's (trainer.optimizer_step)
        spread = max(math.sqrt(st.var), self.cfg.min_spread * abs(st.level))
        score = (x - st.mean) / spread if spread > 0 else 0.0
        return Spike(step, name, x, st.mean, spread, score) if score > z else None
