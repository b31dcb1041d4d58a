"""When to checkpoint: every ``checkpoint.every`` steps, or ``auto``: the Young/Daly interval from the
measured cost of a save and the job's failure rate, re-evaluated after every save.

The job's MTBF is ``checkpoint.device_mtbf_hours`` divided by the number of devices (a job on 1,024
devices fails 1,024 times as often as one device), unless ``checkpoint.mtbf_hours`` gives the job's
own. The cost C of a save is the time training was blocked by it (the local write: the background
upload costs no training time). With a compute interval tau between saves, the expected share of
wall time lost (first order, Young 1974 / Daly 2006) is

    waste(tau) = C / tau  (writing saves)  +  (tau + C) / (2 MTBF)  (recomputing half an interval per failure)

minimised at tau = sqrt(2 C MTBF). ``auto`` saves first after ``checkpoint.auto_first_steps`` steps
(to measure C), then every round(tau / step time) steps. Every rank must reach the same decision,
so the inputs are the maximum over ranks (``Trainer.save`` reduces them) and the arithmetic is pure.
"""
from __future__ import annotations

import statistics

from .metrics import young_daly_interval_s

AUTO = "auto"


def job_mtbf_s(device_mtbf_hours: float, devices: int, mtbf_hours: float | None = None) -> float:
    """The job's mean time between failures in seconds: any one device failing stops it."""
    return 3600.0 * (mtbf_hours if mtbf_hours is not None else device_mtbf_hours / max(1, devices))


def expected_waste(interval_s: float, save_s: float, mtbf_s: float) -> dict:
    """The expected share of wall time lost at a compute interval ``interval_s`` between saves of cost
    ``save_s``, in percent: to the saves, to recomputation after a failure, and their sum."""
    saves = save_s / interval_s
    recompute = (interval_s + save_s) / (2.0 * mtbf_s)
    return {"interval_s": interval_s, "saves_pct": 100 * saves, "recompute_pct": 100 * recompute,
            "total_pct": 100 * (saves + recompute)}


class Cadence:
    """Says when a save is due. ``every``: steps between saves, 0 (only at the end) or ``"auto"``."""

    def __init__(self, every: int | str, *, mtbf_s: float, first_steps: int):
        self.auto = every == AUTO
        self.every = 0 if self.auto else int(every)
        self.mtbf_s = mtbf_s
        self.first_steps = first_steps
        self.next_due = first_steps if self.auto else None  # auto: the step of the next save
        self.costs: list[float] = []

    def start(self, step: int) -> None:
        """The run (re)starts after ``step`` (a resume): auto's first save is ``first_steps`` later, to
        measure this process's cost of a save."""
        if self.auto:
            self.next_due = step + self.first_steps

    def due(self, step: int) -> bool:
        if self.auto:
            return step >= self.next_due
        return self.every > 0 and step % self.every == 0

    def interval_steps(self, step_s: float) -> int:
        """Young/Daly's interval for the saves measured so far (their median cost), in whole steps."""
        tau = young_daly_interval_s(statistics.median(self.costs), self.mtbf_s)
        return max(1, round(tau / step_s))

    def measured(self, step: int, save_s: float, step_s: float) -> dict:
        """Record a save after ``step`` that blocked training ``save_s`` seconds at ``step_s`` seconds per
        step (both the same on every rank); re-plan ``auto``; return the record's cadence fields: the
        Young/Daly interval and the expected waste of the cadence in use and of the other one (the
        configured fixed interval, or Young/Daly's)."""
        self.costs.append(save_s)
        cost = statistics.median(self.costs)
        yd_steps = self.interval_steps(step_s)
        if self.auto:
            self.next_due = step + yd_steps
        out = {"young_daly_interval_s": young_daly_interval_s(cost, self.mtbf_s), "young_daly_every": yd_steps,
               "mtbf_s": self.mtbf_s, "save_cost_s": cost,
               "waste_young_daly": expected_waste(yd_steps * step_s, cost, self.mtbf_s),
               "waste_fixed": (expected_waste(self.every * step_s, cost, self.mtbf_s) if self.every else None),
               "every": AUTO if self.auto else self.every}
        return out


def describe(record: dict) -> str:
    """One log line for a save's cadence fields (:meth:`Cadence.measured`)."""
    yd, fixed = record["waste_young_daly"], record["waste_fixed"]
    line = (f"Young/Daly for save cost {record['save_cost_s']:.3f} s and job MTBF {record['mtbf_s'] / 3600:.1f} h: "
            f"every {record['young_daly_interval_s']:.0f} s = {record['young_daly_every']} steps, expected waste "
            f"{yd['total_pct']:.2f}% ({yd['saves_pct']:.2f}% saves + {yd['recompute_pct']:.2f}% recomputation)")
    if record["every"] == AUTO:
        return line + f"; checkpoint.every=auto: next save in {record['young_daly_every']} steps"
    if fixed is None:
        return line + "; checkpoint.every=0: saves only at the end"
    return line + (f"; configured checkpoint.every={record['every']}: expected waste {fixed['total_pct']:.2f}% "
                   f"({fixed['saves_pct']:.2f}% + {fixed['recompute_pct']:.2f}%)")
