"""The ``gristmill mix MIX.yaml`` job: its model (validation) and ``mix(job)``, which publishes a
mixture manifest of dataset versions pinned by hash (the command: gristmill/cli/mix.py).

The job file (pydantic, `gristmill.config`: unknown keys refused, ``--set``, ``--print-config``)::

    name: web-code             # the mixture's name in the store
    store: ./store             # the manifest store it is published to (a dataset name below resolves here)
    components:
      - dataset: web           # a dataset name in `store`, or a URL <root>/<dataset>[/v<N>]
        weight: 3              # a proportion (any positive number; they are normalised) ...
      - dataset: /data/store/code
        version: 2             # optional: that version instead of the latest
        sha256: 9f2c...        # optional: refuse anything else
        weight: 1
        exhausted: stop        # repeat (default): a fresh epoch; stop: the mixture ends when it runs out
        name: code             # optional: the component's name (default: its dataset's)

Or every component a token budget (``tokens: 2_000_000_000``) instead of a weight: the mixture
then ends when the budgets are used up. See docs/mixtures.md.
"""
from __future__ import annotations

from typing import Annotated, Iterable, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, model_validator

from gristmill import config
from gristmill.config import Float, NonEmptyStr, PositiveInt, ResolvedPath, Section, Str, fail

from .manifest import MAX_TOTAL_ROWS

PositiveFloat = Annotated[Float, Field(gt=0, allow_inf_nan=False)]


def _dataset_ref(value: str, info: ValidationInfo) -> str:
    """A bare name is a dataset in the job's store; anything with a '/' is a path (relative: to the job file) or URL."""
    return config._resolve(value, info) if "/" in value else value


DatasetRef = Annotated[Str, Field(min_length=1), AfterValidator(_dataset_ref)]


def _sha256(value):
    """A pinned manifest hash: 64 lowercase hex digits, as a string. YAML reads an unquoted all-digit
    one as a number (and a leading 0 as octal), so a number is refused with how to write it."""
    if isinstance(value, int) and not isinstance(value, bool):
        fail("a sha256 as a quoted string (YAML read this unquoted all-digit hash as a number, which loses "
             "its leading zeros: write sha256: \"<64 hex digits>\")", f"the number {value}")
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        fail("64 lowercase hex digits (a manifest's sha256, as `gristmill manifest show` prints it)", repr(value))
    return value


Sha256 = Annotated[str, BeforeValidator(_sha256)]


class ComponentConfig(Section):
    dataset: DatasetRef  # a dataset name in `store`, or a dataset URL
    name: Str | None = None  # default: the dataset's name
    version: PositiveInt | None = None  # default: the latest
    sha256: Sha256 | None = None  # pin: refuse a component manifest with another hash
    weight: PositiveFloat | None = None
    # token budget (training tokens: seq_len per sample), below the bound a mixture manifest's reader takes
    tokens: Annotated[PositiveInt, Field(lt=MAX_TOTAL_ROWS)] | None = None
    exhausted: Literal["repeat", "stop"] = "repeat"

    @model_validator(mode="after")
    def _weight_or_tokens(self) -> "ComponentConfig":
        if (self.weight is None) == (self.tokens is None):
            fail("exactly one of weight or tokens", f"weight={self.weight!r}, tokens={self.tokens!r}")
        return self


class MixJob(Section):
    name: NonEmptyStr
    store: Annotated[ResolvedPath, Field(min_length=1)]
    components: Annotated[list[ComponentConfig], Field(min_length=1)]
    # A component's validation documents in another's training split (two versions of one dataset split
    # differently) refuse the mixture; true publishes it with the overlaps recorded in its manifest
    allow_split_overlap: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> "MixJob":
        if len({c.tokens is None for c in self.components}) > 1:
            fail("every component with a weight, or every one with a token budget (tokens)", "both kinds",
                 at=("components",))
        return self


def load(path: str, overrides: Iterable[str] = ()) -> MixJob:
    return config.load(MixJob, path, overrides)


def mix(job: MixJob, source: str = "mix job"):
    """Resolve every component (URL or store name -> the version's manifest, hash-checked), build and publish."""
    from .errors import HashMismatchError, ManifestNotFoundError
    from dataclasses import asdict

    from .mixture import MixtureError, build_mixture, component_url, load_data
    from .split_overlap import split_overlaps
    from .store import ManifestStore, load_manifest

    resolved, names = [], []
    for i, c in enumerate(job.components):
        url = component_url(c.dataset, job.store, c.version)
        try:
            pub = load_manifest(url, expected_sha256=c.sha256)
        except ManifestNotFoundError as e:
            raise MixtureError(f"{source}: components[{i}].dataset: unknown component {c.dataset!r}: {e}") from e
        except HashMismatchError as e:
            if c.sha256 is None or e.expected != c.sha256 or e.actual == c.sha256:  # not the pin: an edited manifest
                raise
            raise MixtureError(f"{source}: components[{i}].sha256: {e}") from None
        name = c.name or pub.manifest.dataset
        if name in names:
            raise MixtureError(f"{source}: components[{i}]: a second component named {name!r}; give it a name")
        names.append(name)
        resolved.append(({"name": name, "weight": c.weight, "tokens": c.tokens, "exhausted": c.exhausted}, pub))
    overlaps = split_overlaps([(spec["name"], pub) for spec, pub in resolved])
    if overlaps and not job.allow_split_overlap:
        raise MixtureError(f"{source}: {overlaps[0].line()}{f' (and {len(overlaps) - 1} more pairs)' if len(overlaps) > 1 else ''}: "
                           "the mixture would train on what it validates; mix versions split alike, or set "
                           "allow_split_overlap: true (recorded in the mixture manifest)")
    try:
        manifest = build_mixture(job.name, resolved, job.store, tuple(asdict(o) for o in overlaps))
    except MixtureError as e:
        raise MixtureError(f"{source}: {e}") from None
    return load_data(ManifestStore(job.store).publish(manifest, ""))  # with its components, as the loader takes it
