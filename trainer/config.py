"""The train job file: one YAML with run, data, model, parallelism, optimizer, checkpoint and eval
sections, one pydantic model each (`gristmill.config`). Unknown keys are errors (a typo must not
silently fall back to a default), and every error reads ``file: section.key: expected ..., got ...``.
"""
from __future__ import annotations

from typing import Annotated, Iterable, Literal

from pydantic import Field

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
    log_every: PositiveInt = 1
    tensorboard: Bool = True  # when torch.utils.tensorboard is importable
    # samples.jsonl: every step's global sample indices as the ranks' batches carried them (one
    # all-gather per step). Off by default: the indices follow from the loader state in the checkpoint.
    log_samples: Bool = False


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
    every: NonNegativeInt = 0  # steps between checkpoints; 0 = only at the end
    keep: PositiveInt = 3  # keep the newest K committed checkpoints
    async_save: Bool = False  # overlap the DCP write with training (committed once every rank is done)
    mtbf_hours: PositiveFloat = 24.0  # for the Young/Daly interval printed after a save
    resume: Bool = True  # continue from the newest checkpoint in <run.dir>/checkpoints that verifies
    allow_manifest_change: Bool = False  # resume onto a different manifest hash (recorded in meta.json)


class EvalConfig(Section):
    every: NonNegativeInt = 0  # steps between validation passes; 0 = never
    batches: PositiveInt = 4
    global_batch: Annotated[Int, Field(ge=0, le=MAX_BATCH)] = 0  # 0 = data.global_batch


class TrainConfig(Section):
    run: RunConfig = RunConfig()
    # validate_default: a job without a data section still gets `data.manifest: ... required`.
    data: DataConfig = Field(default_factory=dict, validate_default=True)
    model: ModelConfig = ModelConfig()
    parallelism: ParallelismConfig = ParallelismConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()


def load(path: str, overrides: Iterable[str] = ()) -> TrainConfig:
    """Read a job YAML; ``overrides`` are ``section.key=value`` strings (YAML values) applied on top."""
    return _load(TrainConfig, path, overrides)
