"""The train job file: one YAML with run, data, model, parallelism, optimizer, checkpoint and eval
sections, one pydantic model each (`gristmill.config`). Unknown keys are errors (a typo must not
silently fall back to a default), and every error reads ``file: section.key: expected ..., got ...``.
"""
from __future__ import annotations

import os
from typing import Annotated, Any, Iterable, Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from gristmill.config import Bool, Float, Int, NonEmptyStr, NonNegativeInt, PositiveInt, Section, Str
from gristmill.config import load as _load

PositiveFloat = Annotated[Float, Field(gt=0)]
# Upper bounds no real run reaches (issue 26): a typo of a few digits is an error here, not an
# allocation traceback later. What fits a device is checked against the memory budget before
# anything is allocated (trainer/budget.py check_fits).
MAX_BATCH = 1 << 24  # sequences per step (the largest published runs use ~10^4)
Width = Annotated[Int, Field(ge=1, le=1 << 17)]  # model.dim, ffn_dim (8B: 4096 / 14336)
Count = Annotated[Int, Field(ge=1, le=1 << 12)]  # layers and heads


class RunConfig(Section):
    dir: Str = "runs/default"  # run directory: metrics.jsonl, checkpoints/ (and samples.jsonl with log_samples)
    steps: PositiveInt = 100  # optimizer steps of the whole run (the LR schedule's length)
    seed: Int = 0  # model init and per-rank RNG
    log_every: PositiveInt = 1  # steps per train record; every rank's timings are gathered then (docs/trainer.md)
    tensorboard: Bool = True  # when torch.utils.tensorboard is importable
    # samples.jsonl: every step's global sample indices as the ranks' batches carried them (one
    # all-gather per step). Off by default: the indices follow from the loader state in the checkpoint.
    log_samples: Bool = False
    # A step, save, evaluation or resume running longer than this on any rank is a hang: that rank
    # dumps its stacks and exits (trainer/watchdog.py) so the launcher restarts the job; the
    # process-group timeout is the same value. 0 turns the watchdog off (the group keeps it).
    hang_timeout_s: Annotated[Float, Field(ge=0)] = 600.0
    # A rank whose own time per step (its step time less its wait in the step's first collective)
    # exceeds the median rank's by this fraction, in this many log windows in a row, is named.
    straggler_fraction: PositiveFloat = 0.2
    straggler_windows: PositiveInt = 3


class DataConfig(Section):
    manifest: NonEmptyStr  # <store>/<dataset>[/v<N>]: the published dataset version (or mixture: gristmill mix) to train on
    expected_sha256: Str | None = None  # pin the manifest; refuse anything else
    seed: Int = 0  # loader shuffle seed
    order: Literal["global", "window"] = "global"
    global_batch: Annotated[Int, Field(ge=1, le=MAX_BATCH)] = 32  # sequences per optimizer step, over all ranks
    micro_batch: Annotated[Int, Field(ge=0, le=MAX_BATCH)] = 0  # sequences per rank per forward; 0 = the whole local batch
    cache_dir: Str | None = None
    prefetch: NonNegativeInt = 4
    # `gristmill serve` endpoints (docs/service.md): batches come from the service, not a local cache;
    # with them, manifest may also be a dataset/mixture name or a manifest sha256 the service resolves
    service: list[NonEmptyStr] = []
    service_token_file: Str | None = None  # bearer token file (else $GRISTMILL_SERVE_TOKEN); never in the job file
    service_tls_root: Str | None = None  # PEM CA of the servers' certificates (grpc+tls://)
    service_tls_cert: Str | None = None  # PEM certificate and key of this client (servers with mutual TLS)
    service_tls_key: Str | None = None
    # a range of steps is retried over the endpoints (backoff with jitter) this long before the run fails:
    # a restart of every server, a rolling update or a node drain shorter than this costs only the wait
    service_deadline_s: PositiveFloat = 120.0


class ModelConfig(Section):
    preset: Str = "tiny"  # see trainer.model.PRESETS (checked there: the presets live with the model)
    dim: Width | None = None  # any field set here overrides the preset
    n_layers: Count | None = None
    n_heads: Count | None = None
    n_kv_heads: Count | None = None
    ffn_dim: Width | None = None
    rope_theta: PositiveFloat | None = None
    norm_eps: PositiveFloat | None = None
    document_mask: Bool = False  # attention within documents, rope restarted (loader documents=True; docs/trainer.md)


class ParallelismConfig(Section):
    dp_shard: Int = -1  # FSDP degree; -1 = all ranks
    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    activation_checkpoint: Literal["none", "selective", "full"] = "none"
    compile: Bool = False
    attention: Literal["auto", "sdpa", "flash"] = "auto"  # auto: flash-attn when installed on GPU, else SDPA


class OptimizerConfig(Section):
    lr: PositiveFloat = 3e-4
    min_lr_ratio: Float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: NonNegativeInt = 10
    betas: tuple[Float, Float] = (0.9, 0.95)
    eps: Float = 1e-8
    weight_decay: Float = 0.1
    grad_clip: Float = 1.0  # max global grad norm; 0 disables clipping (the norm is still logged)
    max_bad_steps: PositiveInt = 5  # this many consecutive non-finite steps stop the run


class CheckpointConfig(Section):
    enabled: Bool = True  # false: never save or resume (throughput benchmarks)
    # where checkpoints commit: any URL the storage seam knows (s3://, gs://, a shared path); None = <run.dir>/checkpoints
    dir: Str | None = None
    # fsspec options of dir's store (an endpoint, a profile); never written to meta.json or a log
    storage_options: dict[str, Any] = {}
    # where each rank writes its shards first (node-local NVMe, shared by a node's ranks); None = <run.dir>/checkpoints
    local_dir: Str | None = None
    every: NonNegativeInt | Literal["auto"] = 0  # steps between checkpoints; 0 = only at the end; auto: Young/Daly
    auto_first_steps: PositiveInt = 10  # every=auto: the first save (which measures the cost of one)
    keep: PositiveInt = 3  # keep the newest K committed checkpoints
    keep_every: NonNegativeInt = 0  # also keep every checkpoint whose step is a multiple of this (milestones); 0 = none
    async_save: Bool = False  # overlap the DCP write with training (committed once every rank is done)
    device_mtbf_hours: PositiveFloat = 50000.0  # one device's MTBF; the job's is this / number of devices
    mtbf_hours: PositiveFloat | None = None  # the job's own MTBF, overriding device_mtbf_hours / devices
    resume: Bool = True  # continue from the newest checkpoint in checkpoint.dir (or a local copy) that verifies
    allow_manifest_change: Bool = False  # resume onto a different manifest hash (recorded in meta.json)

    @field_validator("every", mode="before")
    @classmethod
    def _every(cls, value):
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        raise PydanticCustomError("config", "expected an integer >= 0 or auto, got {got}", {"got": repr(value)})

    def content_dict(self) -> dict:
        """What meta.json records of this section: all but the storage options (credentials)."""
        d = self.to_dict()
        d.pop("storage_options")
        return d


class EvalConfig(Section):
    every: NonNegativeInt = 0  # steps between validation passes; 0 = never
    batches: PositiveInt = 4
    global_batch: Annotated[Int, Field(ge=0, le=MAX_BATCH)] = 0  # 0 = data.global_batch


class SpikesConfig(Section):
    """Loss-spike detection (trainer/spikes.py, docs/trainer.md "Spikes"): a value is a spike when it
    exceeds its running forecast by ``z`` running spreads (exponentially smoothed level, trend and error variance)."""

    action: Literal["log", "stop", "rewind_skip"] = "log"
    loss_z: PositiveFloat = 6.0  # loss spread units above the running mean that make a spike
    grad_norm_z: PositiveFloat | None = None  # the same for the gradient norm; None: not watched
    warmup_steps: NonNegativeInt = 20  # steps that only feed the running statistics (early loss falls fast)
    ema_steps: PositiveInt = 50  # the running statistics' horizon (smoothing weight 1/ema_steps)
    min_spread: Annotated[Float, Field(ge=0)] = 0.01  # the spread is at least this fraction of the mean: a flat loss is no hair trigger
    skip_steps: NonNegativeInt = 0  # rewind_skip: skip this many steps' samples from the checkpoint; 0: the spike's window
    max_rewinds: PositiveInt = 3  # rewinds in one process before a spike stops the run instead


class TrainConfig(Section):
    run: RunConfig = RunConfig()
    # validate_default: a job without a data section still gets `data.manifest: ... required`.
    data: DataConfig = Field(default_factory=dict, validate_default=True)
    model: ModelConfig = ModelConfig()
    parallelism: ParallelismConfig = ParallelismConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()
    spikes: SpikesConfig | None = None  # absent: no detection

    def content_dict(self) -> dict:
        """The job as meta.json records it: every field but the checkpoint store's storage options."""
        return {**self.to_dict(), "checkpoint": self.checkpoint.content_dict()}

    def checkpoint_dir(self) -> str:
        """``checkpoint.dir``, or ``<run.dir>/checkpoints``."""
        return self.checkpoint.dir or os.path.join(self.run.dir, "checkpoints")

    def checkpoint_local_dir(self) -> str:
        """``checkpoint.local_dir``, or ``<run.dir>/checkpoints`` (with a local checkpoint.dir: one tier)."""
        return self.checkpoint.local_dir or os.path.join(self.run.dir, "checkpoints")


def load(path: str, overrides: Iterable[str] = ()) -> TrainConfig:
    """Read a job YAML; ``overrides`` are ``section.key=value`` strings (YAML values) applied on top."""
    return _load(TrainConfig, path, overrides)
