"""Per-step metrics: a JSONL log (plus TensorBoard when installed), MFU against a table of dense
bf16 peaks, and the Young/Daly checkpoint interval."""
from __future__ import annotations

import json
import math
import os
import re

import torch

# Dense (no sparsity) bf16 tensor-core peaks in FLOP/s per device, from the vendors' datasheets,
# by model name as torch.cuda.get_device_name() spells it ("NVIDIA H100 80GB HBM3",
# "NVIDIA L40S", "AMD Instinct MI300X"). A name matches an entry only when the model token is
# equal, never a prefix or a substring: "L40" is not "L4" and "GB200" is not "B200". A variant
# (a later token such as PCIe) refines the model's default. Anything else is "unknown": an MFU
# computed against a guessed peak is worse than none.
PEAK_BF16_FLOPS: dict[str, dict[str | None, float]] = {
    "H100": {None: 989e12, "PCIE": 756e12, "NVL": 835e12},  # None: SXM
    "H200": {None: 989e12},
    "GH200": {None: 989e12},
    "H800": {None: 989e12, "PCIE": 756e12},
    "B200": {None: 2250e12},
    "GB200": {None: 2500e12},
    "B100": {None: 1750e12},
    "A100": {None: 312e12},
    "A800": {None: 312e12},
    "L40S": {None: 362e12},
    "L40": {None: 181e12},
    "L4": {None: 121e12},
    "MI300X": {None: 1307e12},
    "MI325X": {None: 1307e12},
}
_VENDOR_WORDS = {"NVIDIA", "AMD", "INSTINCT", "TESLA"}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def peak_flops(name: str) -> float | None:
    """The dense bf16 peak of one device, or None when the hardware is not in the table.
    The model is the first word after the vendor's (words split at spaces, '-' and '_')."""
    words = [w for w in re.split(r"[\s_-]+", name.upper()) if w]
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    if not words or words[0] not in PEAK_BF16_FLOPS:
        return None
    variants = PEAK_BF16_FLOPS[words[0]]
    found = [variants[w] for w in words[1:] if w in variants]
    return found[0] if found else variants[None]


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak: float | None) -> float | None:
    return None if peak is None else tokens_per_s_per_device * flops_per_token / peak


def young_daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum checkpoint interval sqrt(2 * C * MTBF) (Daly: valid for C << MTBF)."""
    return math.sqrt(2.0 * save_s * mtbf_s)


class MetricsLog:
    """Rank 0 appends one JSON object per record to ``<run_dir>/metrics.jsonl``."""

    def __init__(self, run_dir: str, *, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional: the JSONL log is the record
                SummaryWriter = None
            if SummaryWriter is not None:
                self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True, allow_nan=True) + "\n")
        if self.tb is not None and "step" in record:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    self.tb.add_scalar(f"{record.get('kind', 'train')}/{key}", value, record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def format_step(r: dict) -> str:
    parts = [f"step {r['step']:>6}", f"loss {r['loss']:.4f}", f"gnorm {r['grad_norm']:.3f}", f"lr {r['lr']:.2e}",
             f"tok/s {r['tokens_per_s']:,.0f}", f"wait {r['input_wait_pct']:.1f}%"]
    parts.append(f"mfu {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "mfu n/a")
    if r.get("skipped"):
        parts.append("SKIPPED (non-finite)")
    return "  ".join(parts)
