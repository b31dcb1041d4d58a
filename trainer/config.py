"""The train job file: one YAML with run, data, model, parallelism, optimizer, checkpoint and eval
sections, read into dataclasses. Unknown keys are errors (a typo must not silently fall back to a
default), and every error names the file, the section and the key.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

import yaml
from gristmill.errors import ConfigError as _ConfigError


class ConfigError(_ConfigError):
    """The job file is malformed: names the file, the key and what was expected."""


@dataclass
class RunConfig:
    dir: str = "runs/default"  # run directory: metrics.jsonl, samples.jsonl, checkpoints/
    steps: int = 100  # optimizer steps of the whole run (the LR schedule's length)
    seed: int = 0  # model init and per-rank RNG
    log_every: int = 1
    tensorboard: bool = True  # when torch.utils.tensorboard is importable


@dataclass
class DataConfig:
    manifest: str = ""  # <store>/<dataset>[/v<N>]: the published dataset version
    expected_sha256: str | None = None  # pin the manifest; refuse anything else
    seed: int = 0  # loader shuffle seed
    order: str = "global"  # loader order: global | window
    global_batch: int = 32  # sequences per optimizer step, over all ranks
    micro_batch: int = 0  # sequences per rank per forward; 0 = the whole local batch (no accumulation)
    cache_dir: str | None = None
    prefetch: int = 4
    loader: str = "loader:Loader"  # module:Class implementing the loader API (docs/architecture.md)


@dataclass
class ModelConfig:
    preset: str = "tiny"  # see trainer.model.PRESETS
    dim: int | None = None  # any field set here overrides the preset
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    ffn_dim: int | None = None
    rope_theta: float | None = None
    norm_eps: float | None = None


@dataclass
class ParallelismConfig:
    dp_shard: int = -1  # FSDP degree; -1 = all ranks
    mixed_precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    activation_checkpoint: str = "none"  # none | selective | full
    compile: bool = False
    attention: str = "auto"  # auto (flash-attn when installed on GPU, else SDPA) | sdpa | flash


@dataclass
class OptimizerConfig:
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 10
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping (the norm is still logged)
    max_bad_steps: int = 5  # this many consecutive non-finite steps stop the run


@dataclass
class CheckpointConfig:
    enabled: bool = True  # false: never save or resume (throughput benchmarks)
    every: int = 0  # steps between checkpoints; 0 = only at the end
    keep: int = 3  # keep the newest K committed checkpoints
    async_save: bool = False  # overlap the DCP write with training (committed once every rank is done)
    mtbf_hours: float = 24.0  # for the Young/Daly interval printed after a save
    resume: bool = True  # continue from the newest checkpoint in <run.dir>/checkpoints that verifies
    allow_manifest_change: bool = False  # resume onto a different manifest hash (recorded in meta.json)


@dataclass
class EvalConfig:
    every: int = 0  # steps between validation passes; 0 = never
    batches: int = 4
    global_batch: int = 0  # 0 = data.global_batch


@dataclass
class JobConfig:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


CHOICES = {
    ("data", "order"): ("global", "window"),
    ("parallelism", "mixed_precision"): ("auto", "bf16", "fp32"),
    ("parallelism", "activation_checkpoint"): ("none", "selective", "full"),
    ("parallelism", "attention"): ("auto", "sdpa", "flash"),
}


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Check ``value`` against the annotation string of a dataclass field."""
    typ = str(typ)
    if value is None and "None" in typ:
        return None
    if typ.startswith("tuple"):
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ConfigError(f"{where}: expected a list of two numbers, got {value!r}")
        return tuple(float(v) for v in value)
    base = typ.split("|")[0].strip()
    if base == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if base == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if base == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _section(cls, raw: Any, name: str, source: str):
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: section {name!r} must be a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(f'{name}.{k}' for k in unknown)}; "
                          f"{name} accepts {', '.join(sorted(known))}")
    values = {}
    for key, value in raw.items():
        where = f"{source}: {name}.{key}"
        values[key] = _coerce(value, known[key].type, where)
        allowed = CHOICES.get((name, key))
        if allowed and values[key] not in allowed:
            raise ConfigError(f"{where}: must be one of {', '.join(allowed)}, got {value!r}")
    return cls(**values)


def from_dict(raw: Any, source: str = "<job>") -> JobConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a job file is a mapping of sections, got {type(raw).__name__}")
    sections = {f.name: f for f in fields(JobConfig)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {', '.join(unknown)}; a job has {', '.join(sections)}")
    cfg = JobConfig(**{name: _section(f.default_factory, raw.get(name), name, source)
                       for name, f in sections.items()})
    validate(cfg, source)
    return cfg


def validate(cfg: JobConfig, source: str = "<job>") -> None:
    if not cfg.data.manifest:
        raise ConfigError(f"{source}: data.manifest is required (the published dataset version to train on)")
    positive = {"run.steps": cfg.run.steps, "run.log_every": cfg.run.log_every, "data.global_batch": cfg.data.global_batch,
                "checkpoint.keep": cfg.checkpoint.keep, "optimizer.max_bad_steps": cfg.optimizer.max_bad_steps}
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{source}: {key} must be positive, got {value}")
    for key, value in {"data.micro_batch": cfg.data.micro_batch, "checkpoint.every": cfg.checkpoint.every,
                       "eval.every": cfg.eval.every, "optimizer.warmup_steps": cfg.optimizer.warmup_steps}.items():
        if value < 0:
            raise ConfigError(f"{source}: {key} must be >= 0, got {value}")
    if cfg.optimizer.lr <= 0:
        raise ConfigError(f"{source}: optimizer.lr must be positive, got {cfg.optimizer.lr}")


def load(path: str, overrides: list[str] = ()) -> JobConfig:
    """Read a job YAML; ``overrides`` are ``section.key=value`` strings (YAML values) applied on top."""
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    raw = raw if raw is not None else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise ConfigError(f"override {item!r}: expected section.key=value, e.g. run.steps=100")
        if not isinstance(raw.setdefault(section, {}), dict):
            raise ConfigError(f"{path}: section {section!r} must be a mapping")
        raw[section][name] = yaml.safe_load(value)
    return from_dict(raw, path)
