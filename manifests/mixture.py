"""The mixture manifest: several dataset versions, pinned by sha256, blended by integer parts.

A mixture is published in a manifest store exactly like a dataset (``<root>/<name>/v<N>/manifest.json``
plus ``latest``) but its version directory holds no other file: it pins each component's
*manifest* by hash, and the loader reads the components' shards where they lie. Its identity is
the sha256 of its canonical JSON without the fields that say where or when it was published
(``version``, ``created_at``, ``code_version``, ``locations``: moving the component datasets or
republishing the mixture keeps the hash) and without ``sha256`` itself.

Proportions are stored as integer ``parts`` summing to ``period`` (at most :data:`MAX_PERIOD`),
computed once here from the job's weights or token budgets: the loader's interleave uses only
these integers (loader/mixture.py), so no floating point enters the sample order. The full
format is in docs/format.md; the interleave, its bound and the exhaustion policies in
docs/mixtures.md.
"""
from __future__ import annotations

import math
import posixpath
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from functools import cached_property
from typing import Any

from .errors import ManifestError, SchemaVersionError
from .hashing import canonical_json, sha256_bytes
from .manifest import MAX_TOTAL_ROWS, Manifest, VersionedDocument, _int, _require, _sha, checked_sha256, parse_json
from .storage import is_url, join_url, split_url
from .store import DATASET_NAME, Published, _load_as, join

KIND = "mixture"
MIXTURE_SCHEMA_VERSION = 1
MAX_PERIOD = 1 << 20  # parts sum to at most this: the loader keeps a one-period table of 12 bytes a part
MAX_COMPONENTS = 1024  # building the period's table costs period x components: a forged list must not stall a load
POLICIES = ("repeat", "stop")  # what a component that runs out does: a fresh epoch, or end the mixture
UNHASHED_FIELDS = ("version", "created_at", "code_version", "locations", "sha256")
REQUIRED = ("kind", "schema_version", "name", "seq_len", "token_dtype", "tokenizer", "period", "components", "locations")


class MixtureError(ManifestError):
    """A mixture (its job, its manifest or its components) is not valid: names the component and what differs."""


@dataclass(frozen=True)
class MixTokenizer:
    """The tokenizer every component shares (the components' ``tokenizer`` minus its path)."""

    sha256: str
    vocab_size: int
    eos_id: int


@dataclass(frozen=True)
class Component:
    name: str  # unique within the mixture
    dataset: str  # the component manifest's dataset name
    sha256: str  # the component manifest's hash: what the mixture pins
    parts: int  # its share of every period of the interleave: parts / period of all samples
    exhausted: str  # "repeat" (a fresh epoch) or "stop" (the mixture ends where it would need one more row)
    weight: float | None = None  # as given in the job (None when a token budget was given)
    tokens: int | None = None  # token budget as given (None when a weight was given)
    budget_samples: int | None = None  # ceil(tokens / seq_len): the samples the budget allows, at most
    train_rows: int = 0  # rows of the component's train split (what "stop" runs out of)

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "Component":
        _require(d, ("name", "dataset", "sha256", "parts", "exhausted", "train_rows"), where)
        if d["exhausted"] not in POLICIES:
            raise MixtureError(f"{where}.exhausted: expected one of {', '.join(POLICIES)}, got {d['exhausted']!r}")
        weight, tokens, budget = d.get("weight"), d.get("tokens"), d.get("budget_samples")
        if (weight is None) == (tokens is None):
            raise MixtureError(f"{where}: give exactly one of weight or tokens")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0
                                   or not math.isfinite(weight)):
            raise MixtureError(f"{where}.weight: expected a finite number > 0, got {weight!r}")
        if weight is not None and budget is not None:
            raise MixtureError(f"{where}: budget_samples belongs to a token budget, and this component has a weight")
        if tokens is not None:
            tokens = _int(d, "tokens", where, hi=MAX_TOTAL_ROWS, lo=1)
            budget = _int(d, "budget_samples", where, hi=MAX_TOTAL_ROWS, lo=1) if budget is not None else None
            if budget is None:
                raise MixtureError(f"{where}: a token budget needs budget_samples")
        return cls(name=str(d["name"]), dataset=str(d["dataset"]), sha256=_sha(d["sha256"], f"{where}.sha256"),
                   parts=_int(d, "parts", where, hi=MAX_PERIOD + 1, lo=1), exhausted=d["exhausted"],
                   weight=weight, tokens=tokens, budget_samples=budget,
                   train_rows=_int(d, "train_rows", where, hi=MAX_TOTAL_ROWS))

    @property
    def limit(self) -> int | None:
        """Train samples after which this component ends the mixture (None: never)."""
        caps = [x for x in (self.budget_samples, self.train_rows if self.exhausted == "stop" else None) if x is not None]
        return min(caps) if caps else None


@dataclass(frozen=True)
class MixtureManifest(VersionedDocument):
    name: str
    seq_len: int
    token_dtype: str
    tokenizer: MixTokenizer
    period: int
    components: tuple[Component, ...]
    locations: dict = field(default_factory=dict)  # component name -> {"url": ..., "version": N} (unhashed)
    # validation documents of one component in another's training split, published because the job
    # allowed it (``allow_split_overlap``; manifests/split_overlap.py): hashed, absent when none
    split_overlaps: tuple[dict, ...] = ()
    schema_version: int = MIXTURE_SCHEMA_VERSION
    code_version: str | None = None
    version: int | None = None
    created_at: str | None = None
    kind: str = KIND

    # -- what dataset-reading code asks of a manifest (trainer, loader) -----------------------
    @property
    def dataset(self) -> str:
        """The store directory a mixture is published under (a dataset's is its dataset name)."""
        return self.name

    @property
    def row_tokens(self) -> int:
        return self.seq_len + 1

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise MixtureError(f"mixture {self.name!r} has no component {name!r}; it has "
                           f"{', '.join(c.name for c in self.components)}")

    # -- identity -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["components"] = [asdict(c) for c in self.components]
        if self.split_overlaps:
            d["split_overlaps"] = [dict(o) for o in self.split_overlaps]
        else:
            del d["split_overlaps"]  # a mixture without overlaps hashes as before the field existed
        return d

    @cached_property
    def sha256(self) -> str:
        """Computed once, as a dataset manifest's (never changed in place)."""
        return content_sha256(self.to_dict())

    # -- parsing --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, *, expected_sha256: str | None = None) -> "MixtureManifest":
        if not isinstance(d, dict):
            raise MixtureError(f"mixture manifest: expected a JSON object, got {type(d).__name__}")
        if d.get("kind") != KIND:
            raise MixtureError(f"manifest: kind is {d.get('kind')!r}, not {KIND!r}: this is not a mixture manifest "
                               f"(a dataset URL works wherever a mixture URL does)")
        if type(d.get("schema_version")) is not int or d.get("schema_version") != MIXTURE_SCHEMA_VERSION:
            raise SchemaVersionError(f"mixture manifest: unknown schema_version {d.get('schema_version')!r}; this "
                                     f"gristmill reads version {MIXTURE_SCHEMA_VERSION}")
        _require(d, REQUIRED, "mixture")
        if d["token_dtype"] not in ("uint16", "uint32"):
            raise MixtureError(f"mixture.token_dtype: must be uint16 or uint32, got {d['token_dtype']!r}")
        tok = d["tokenizer"]
        _require(tok, ("sha256", "vocab_size", "eos_id"), "mixture.tokenizer")
        comps = d["components"]
        if not isinstance(comps, list) or not comps:
            raise MixtureError("mixture.components: expected a non-empty list")
        if len(comps) > MAX_COMPONENTS:
            raise MixtureError(f"mixture.components: {len(comps)} components, more than the {MAX_COMPONENTS} allowed")
        if not isinstance(d["locations"], dict):
            raise MixtureError("mixture.locations: expected an object (component name -> url, version)")
        m = cls(name=str(d["name"]), seq_len=_int(d, "seq_len", "mixture", lo=1),
                token_dtype=d["token_dtype"],
                tokenizer=MixTokenizer(_sha(tok["sha256"], "mixture.tokenizer.sha256"),
                                       _int(tok, "vocab_size", "mixture.tokenizer", lo=1),
                                       _int(tok, "eos_id", "mixture.tokenizer")),
                period=_int(d, "period", "mixture", hi=MAX_PERIOD + 1, lo=1),
                components=tuple(Component.from_dict(c, f"components[{i}]") for i, c in enumerate(comps)),
                locations=d["locations"], code_version=d.get("code_version"), version=d.get("version"),
                created_at=d.get("created_at"), split_overlaps=_split_overlaps(d.get("split_overlaps", [])))
        names = [c.name for c in m.components]
        if len(set(names)) != len(names):
            raise MixtureError(f"mixture.components: two components share a name ({', '.join(names)})")
        refuse_repeated_manifests([c.sha256 for c in m.components])
        for c in m.components:
            if c.tokens is not None and c.budget_samples != -(-c.tokens // m.seq_len):
                raise MixtureError(f"mixture {m.name!r}: component {c.name!r}: budget_samples {c.budget_samples} is not "
                                   f"ceil(tokens {c.tokens} / seq_len {m.seq_len})")
        if sum(c.parts for c in m.components) != m.period:
            raise MixtureError(f"mixture.period: {m.period} is not the sum of the components' parts "
                               f"({sum(c.parts for c in m.components)})")
        if len({c.tokens is None for c in m.components}) > 1:
            raise MixtureError("mixture.components: either every component has a weight or every one a token budget")
        for c in m.components:
            loc = m.locations.get(c.name)
            if not isinstance(loc, dict) or not isinstance(loc.get("url"), str) or not loc["url"]:
                raise MixtureError(f"mixture.locations: no url for component {c.name!r}")
        checked_sha256(m, d, expected_sha256, "mixture manifest", UNHASHED_FIELDS)
        return m

    @classmethod
    def from_json(cls, text: str | bytes, *, expected_sha256: str | None = None,
                  source: str = "manifest") -> "MixtureManifest":
        return cls.from_dict(parse_json(text, source), expected_sha256=expected_sha256)


def _split_overlaps(v: Any) -> tuple[dict, ...]:
    if not isinstance(v, list) or not all(isinstance(o, dict) for o in v):
        raise MixtureError("mixture.split_overlaps: expected a list of objects (validation, training, documents, of, by)")
    return tuple(v)


def content_sha256(d: dict) -> str:
    return sha256_bytes(canonical_json({k: v for k, v in d.items() if k not in UNHASHED_FIELDS}))


def manifest_from_json(text, *, expected_sha256=None, source="manifest") -> Manifest | MixtureManifest:
    """Whichever kind the manifest text is: a mixture by its ``kind`` field, else a dataset (hash-checked)."""
    d = parse_json(text, source)
    if isinstance(d, dict) and d.get("kind") == KIND:
        return MixtureManifest.from_dict(d, expected_sha256=expected_sha256)
    return Manifest.from_dict(d, expected_sha256=expected_sha256)


class _Either:
    """``_load_as``'s reader for either kind (``manifest_from_json``)."""

    from_json = staticmethod(manifest_from_json)


# -- the published form: the mixture plus its loaded components ---------------------------------
@dataclass(frozen=True)
class PublishedMixture:
    manifest: MixtureManifest
    url: str  # the mixture's version directory
    components: tuple[Published, ...]  # in manifest order, each hash-checked against its pin


def is_mixture(published) -> bool:
    return isinstance(published, PublishedMixture)


def resolve_location(mixture_url: str, location: str) -> str:
    """A component URL as recorded: relative (same store: ``../../web/v1``) to the mixture's version dir, or absolute."""
    if is_url(location) or location.startswith("/"):
        return location
    protocol, path = split_url(mixture_url)
    return join_url(protocol, posixpath.normpath(posixpath.join(path, location)))


def load_data(url: str | Published | PublishedMixture, *, expected_sha256: str | None = None,
              **storage_options) -> Published | PublishedMixture:
    """A dataset version or a mixture, whichever ``url`` names; a mixture comes with its components loaded,
    each checked against the hash it pins and against the mixture's seq_len, dtype and tokenizer."""
    if isinstance(url, PublishedMixture):
        return url
    pub = url if isinstance(url, Published) else load_either(url, expected_sha256=expected_sha256, **storage_options)
    if not isinstance(pub.manifest, MixtureManifest):
        return pub
    return open_components(pub.manifest, pub.url, storage_options)


def load_either(url: str, *, expected_sha256: str | None = None, **storage_options) -> Published:
    """The manifest ``url`` names, a dataset's or a mixture's, as it is (a mixture's components not opened)."""
    return _load_as(_Either, url, expected_sha256, storage_options)


def open_components(m: MixtureManifest, url: str, storage_options: dict | None = None) -> PublishedMixture:
    """The mixture with its components loaded from where it records them."""
    from .errors import ManifestNotFoundError

    def load(c: Component) -> Published:
        where = resolve_location(url, m.locations[c.name]["url"])
        # Options of the mixture's filesystem fit a component on the same one only.
        same = split_url(where)[0] == split_url(url)[0]
        try:
            return _load_as(Manifest, where, c.sha256, (storage_options or {}) if same else {})
        except ManifestNotFoundError as e:
            raise MixtureError(f"mixture {m.name!r}: component {c.name!r} ({c.dataset}, manifest {c.sha256}) is not at "
                               f"{where}: {e}") from e

    return with_components(m, url, load)


def with_components(m: MixtureManifest, url: str, load) -> PublishedMixture:
    """The mixture with each component ``load(component) -> Published`` gives (hash-checked against its
    pin by ``load``), each checked to fit the mixture: from the store (``open_components``) or from a
    service's reply (``loader.service.client``)."""
    comps = []
    for c in m.components:
        pub = load(c)
        check_component(m, c, pub.manifest)
        comps.append(pub)
    return PublishedMixture(m, url, tuple(comps))


def refuse_repeated_manifests(shas: list[str]) -> None:
    # Two components pinning one manifest would read the same rows in lockstep (a seed per manifest).
    if len(set(shas)) != len(shas):
        raise MixtureError("components: two components pin the same dataset manifest; give it one component with "
                           "their summed weight")


def check_component(m: MixtureManifest, c: Component, cm: Manifest) -> None:
    """A component must fit the mixture: the same seq_len, token dtype and tokenizer (hash, vocab, eos)."""
    for what, mine, theirs in (("seq_len", m.seq_len, cm.seq_len), ("token_dtype", m.token_dtype, cm.token_dtype),
                               ("tokenizer.sha256", m.tokenizer.sha256, cm.tokenizer.sha256),
                               ("tokenizer.vocab_size", m.tokenizer.vocab_size, cm.tokenizer.vocab_size),
                               ("tokenizer.eos_id", m.tokenizer.eos_id, cm.tokenizer.eos_id)):
        if mine != theirs:
            raise MixtureError(f"mixture {m.name!r}: component {c.name!r} ({cm.dataset}) has {what} {theirs!r}, the "
                               f"mixture {mine!r}; every component must share seq_len, token dtype and tokenizer")
    rows = sum(s.rows for s in cm.shards_of("train"))
    if c.train_rows != rows:  # what `stop` runs out of: a fact of the pinned manifest, checked like the others
        raise MixtureError(f"mixture {m.name!r}: component {c.name!r} states train_rows {c.train_rows}, its manifest "
                           f"{cm.sha256[:12]} has {rows}")


# -- building (gristmill mix) ----------------------------------------------------------------------
def apportion(shares: list[Fraction], limit: int = MAX_PERIOD) -> list[int]:
    """Integer parts proportional to ``shares``: exact when the shares' common denominator fits ``limit``,
    else largest remainder at ``limit`` parts (ties to the earlier component). A share below
    ``1 / limit`` may get 0 parts; the caller refuses that."""
    total = sum(shares)
    shares = [s / total for s in shares]
    q = math.lcm(*(s.denominator for s in shares))
    if q <= limit:
        return [int(s * q) for s in shares]
    floors = [math.floor(s * limit) for s in shares]
    rest = limit - sum(floors)
    by_remainder = sorted(range(len(shares)), key=lambda i: (-(shares[i] * limit - floors[i]), i))
    for i in by_remainder[:rest]:
        floors[i] += 1
    return floors


def build_mixture(name: str, resolved: list[tuple[dict, Published]], store_root: str,
                  split_overlaps: tuple[dict, ...] = ()) -> MixtureManifest:
    """The mixture of resolved components: ``(spec, published)`` with spec keys name, weight, tokens, exhausted;
    ``split_overlaps``: the overlaps its job allowed (recorded)."""
    from .provenance import code_version

    if not DATASET_NAME.fullmatch(name):
        raise MixtureError(f"mixture name {name!r} must match {DATASET_NAME.pattern}")
    first_spec, first = resolved[0]
    fm = first.manifest
    if len({spec["tokens"] is None for spec, _ in resolved}) > 1:
        raise MixtureError("components: give every component a weight, or every one a token budget (tokens), not "
                           "a mix of both: a budget fixes the mixture's length, a weight only a proportion")
    refuse_repeated_manifests([pub.manifest.sha256 for _, pub in resolved])
    budgets = first_spec["tokens"] is not None
    comps, locations = [], {}
    for spec, pub in resolved:
        m = pub.manifest
        train_rows = sum(s.rows for s in m.shards_of("train"))
        if train_rows == 0:
            raise MixtureError(f"component {spec['name']!r} ({pub.url}) has no train rows")
        budget = -(-spec["tokens"] // m.seq_len) if budgets else None
        if budget is not None and spec["exhausted"] == "stop" and budget > train_rows:
            raise MixtureError(f"component {spec['name']!r}: its budget of {spec['tokens']:,} tokens is {budget:,} "
                               f"samples of {m.seq_len} tokens, more than its {train_rows:,} train rows, with "
                               f"exhausted: stop; lower the budget or set exhausted: repeat")
        comps.append(Component(name=spec["name"], dataset=m.dataset, sha256=m.sha256, parts=1,
                               exhausted=spec["exhausted"], weight=spec["weight"], tokens=spec["tokens"],
                               budget_samples=budget, train_rows=train_rows))
        locations[spec["name"]] = {"url": _relative(pub.url, store_root, name), "version": m.version}
    shares = [Fraction(c.budget_samples) if budgets else Fraction(str(c.weight)) for c in comps]
    parts = apportion(shares)
    if min(parts) < 1:
        small = comps[parts.index(min(parts))].name
        raise MixtureError(f"component {small!r}: its share is below 1/{MAX_PERIOD} of the mixture, too small to "
                           f"place; raise its weight or budget")
    comps = [replace(c, parts=p) for c, p in zip(comps, parts)]
    mix = MixtureManifest(name=name, seq_len=fm.seq_len, token_dtype=fm.token_dtype,
                          tokenizer=MixTokenizer(fm.tokenizer.sha256, fm.tokenizer.vocab_size, fm.tokenizer.eos_id),
                          period=sum(parts), components=tuple(comps), locations=locations, code_version=code_version(),
                          split_overlaps=tuple(split_overlaps))
    for c, (_, pub) in zip(mix.components, resolved):
        check_component(mix, c, pub.manifest)
    return mix


def _relative(component_url: str, store_root: str, name: str) -> str:
    """Inside the mixture's store: relative to the mixture's version directory, so the store can move whole."""
    root = store_root.rstrip("/")
    if component_url.startswith(root + "/"):
        return posixpath.join("..", "..", component_url[len(root) + 1:])
    return component_url


def component_url(dataset: str, store_root: str, version: int | None) -> str:
    """A component named in a mix job: a URL (``<root>/<dataset>[/v<N>]``), or a dataset name in the mixture's store."""
    url = dataset if ("/" in dataset or is_url(dataset)) else join(store_root, dataset)
    return join(url, f"v{version}") if version is not None else url
