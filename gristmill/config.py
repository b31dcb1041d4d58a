"""The one configuration mechanism of every gristmill job file (``prepare`` and ``train``).

A job is a tree of pydantic v2 models (subclasses of `Section`): the type hints, ``Literal``
choices and ``Field`` bounds are the validation rules, and ``extra="forbid"`` refuses unknown
keys, so a typo never falls back to a default. This module turns that into one command-line
experience:

* `read_yaml`: YAML with duplicate keys refused (the error names the key and both lines);
* `apply_overrides`: ``--set a.b=c`` / ``--set inputs[0].format=jsonl`` (values are YAML);
* `validate` / `Section.from_dict` / `load`: every `ValidationError` becomes one
  `gristmill.errors.ConfigError` of the shape ``section.key: expected ..., got ...``;
* `dump_yaml`: the resolved job as YAML (``--print-config``), which loads back to the same job
  (credentials in storage options masked: those load back as ``<masked>``).

Paths typed `ResolvedPath` are made absolute against the job file's directory (``base_dir``).
Imports neither torch nor Ray: every part can use it.
"""
from __future__ import annotations

import difflib
import os
import re
import reprlib
import types
import typing
from typing import Annotated, Any, ClassVar, Iterable, Literal, Union

import annotated_types
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from gristmill.errors import ConfigError

# -- types -------------------------------------------------------------------------------------
# Strict scalars: YAML already types its values, so a quoted '8' for an integer or 'yes' for a
# bool is a mistake to report, not a value to coerce. A float accepts an int.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
NonEmptyStr = Annotated[Str, Field(min_length=1)]
PositiveInt = Annotated[Int, Field(ge=1)]
NonNegativeInt = Annotated[Int, Field(ge=0)]


def _is_url(path: str) -> bool:
    """``manifests.storage.is_url``, which a leaf may not import (nor fsspec, which only the storage module
    imports): fsspec's reading of a URL, a protocol of two or more characters before the first ``://``
    (``C://x`` is a Windows path) or a ``data:`` URL. tests/test_config.py holds the two to the same answers."""
    protocol, sep, _ = path.partition("://")
    return (sep != "" and len(protocol) > 1) or path.startswith("data:")


def _resolve(value: str, info: ValidationInfo) -> str:
    """A local relative path -> absolute against the job file's directory (URLs are left alone)."""
    base = (info.context or {}).get("base_dir")
    if not (base is None or not value or _is_url(value) or os.path.isabs(value)):
        value = os.path.normpath(os.path.join(base, value))
    try:  # a name that is not UTF-8 (a folder named in another encoding) fails inside a task, after work began
        value.encode()
    except UnicodeEncodeError:
        fail("a path in UTF-8 (run dirs, manifests and document ids name files in UTF-8); rename the folder",
             repr(value.encode(errors="surrogateescape")))
    return value


ResolvedPath = Annotated[Str, AfterValidator(_resolve)]


def fail(expected: str, got: str, at: tuple = ()) -> typing.NoReturn:
    """Raise from a validator: becomes ``<location>[.at]: expected <expected>, got <got>``.

    ``at`` extends the location below the model a model validator runs on (e.g. ``("max_chars",)``)."""
    raise PydanticCustomError("config", "expected {expected}, got {got}", {"expected": expected, "got": got, "at": at})


def no_format(path: str) -> str:
    """The ``got`` of a file entry with no ``format`` whose name does not tell it (a job's inputs, eval sets)."""
    return f"no format, and the name {path!r} does not tell it"


class Section(BaseModel):
    """Base of every job-file model: unknown keys refused, immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    SECTION: ClassVar[str] = ""  # the section's key in its job file: the error location when validated alone

    @classmethod
    def from_dict(cls, d: Any, *, where: str | None = None, base_dir: str | None = None):
        """Validate ``d`` (a section or a whole job as parsed YAML); ``where`` prefixes errors (a file name)."""
        return validate(cls, {} if d is None and cls.SECTION else d, source=where, base_dir=base_dir)

    @model_validator(mode="before")
    @classmethod
    def _null_sections(cls, d: Any) -> Any:
        # `extract:` with nothing under it is that section with its defaults; a null *optional*
        # section (`fuzzy_dedup: null`) stays None, i.e. off.
        if isinstance(d, dict):
            nulls = {k: {} for k, v in d.items() if v is None and k in cls.model_fields
                     and isinstance(cls.model_fields[k].annotation, type)
                     and issubclass(cls.model_fields[k].annotation, BaseModel)}
            d = {**d, **nulls} if nulls else d
        return d

    def to_dict(self) -> dict:
        """Every field, defaults included, as JSON-able values (tuples become lists)."""
        return self.model_dump(mode="json")


# -- YAML --------------------------------------------------------------------------------------
class _DuplicateKey(yaml.YAMLError):
    pass


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """Safe YAML that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden on purpose
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first:
                        raise _DuplicateKey(f"duplicate key {key!r} at lines {first[key]} and {line}; "
                                            f"a key may appear once in a mapping")
                    first[key] = line
                except TypeError:  # an unhashable key: SafeConstructor reports it
                    pass
        return super().construct_mapping(node, deep)


# A job file expands to at most this many YAML nodes, aliases followed (a real one has a few
# hundred). Anchors and aliases (`<<: *base`) are fine; a "billion laughs" document, a few
# hundred bytes that expand to 10^9 nodes, is refused before anything is built from it.
MAX_YAML_NODES = 100_000



def existing_local_file(path: str | None, what: str) -> str | None:
    """A local file must exist now (a URL is checked by whoever opens it)."""
    if path is not None and not _is_url(path) and not os.path.exists(path):
        fail(f"an existing {what} file", f"{path!r}, which does not exist")
    return path

def _expanded_nodes(root: yaml.Node, source: str) -> None:
    """Count the nodes of ``root`` as if every alias were copied out, in time linear in the
    composed graph (each node's size is computed once); refuse past ``MAX_YAML_NODES``."""
    size: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are being counted: meeting one again is a loop
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        kids = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        if not done:
            if id(node) in open_:
                raise ConfigError(f"{source}: line {node.start_mark.line + 1}: a value that contains itself (an alias "
                                  "inside its own anchor); a job file is a tree")
            open_.add(id(node))
            stack.append((node, True))
            for k in kids:
                if id(k) in open_ and id(k) not in size:
                    raise ConfigError(f"{source}: line {k.start_mark.line + 1}: a value that contains itself (an alias "
                                      "inside its own anchor); a job file is a tree")
                if id(k) not in size:
                    stack.append((k, False))
            continue
        open_.discard(id(node))
        size[id(node)] = 1 + sum(size[id(k)] for k in kids)
        if size[id(node)] > MAX_YAML_NODES:
            raise ConfigError(f"{source}: expands to more than {MAX_YAML_NODES:,} YAML values once its aliases (*name) "
                              f"are followed (line {node.start_mark.line + 1}); a job file that large is a mistake or an "
                              "attack: write the values out or use fewer aliases of aliases")


def parse_yaml(text: str, source: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()  # the graph only: aliases are references here, not copies
        if node is None:
            return None
        _expanded_nodes(node, source)
        return loader.construct_document(node)  # noqa: S506 - _Loader is a SafeLoader
    except _DuplicateKey as e:
        raise ConfigError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source} is not readable YAML: {_short(str(e))}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply (or an alias inside itself) to be a job file") from None
    finally:
        loader.dispose()


def _short(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def read_yaml(path: str) -> Any:
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"job file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"job file {path} is not readable: {e}") from e
    return parse_yaml(text, f"job file {path}")


MASKED = "<masked>"
# Keys of a storage-options mapping whose values are credentials (s3fs key/secret/token, botocore's
# aws_secret_access_key, Azure's account_key/sas_token/connection_string, GCS's token, passwords).
_SECRET_KEY = re.compile(r"key|secret|token|password|passwd|credential|sas|signature|connection_string|auth",
                         re.IGNORECASE)


def _masked(value: Any, in_options: bool = False) -> Any:
    """``value`` with every credential inside a storage-options mapping (a key ending in ``_options``:
    ``storage_options``, ``work_dir_options``) replaced by ``MASKED``, at any depth (``client_kwargs``)."""
    if isinstance(value, dict):
        return {k: MASKED if in_options and _SECRET_KEY.search(str(k)) and value[k] not in (None, "", {})
                else _masked(v, in_options or str(k).endswith("_options")) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, in_options) for v in value]
    return value


def dump_yaml(cfg: BaseModel, *, mask_secrets: bool = True) -> str:
    """The resolved job, every default written out, in the models' field order; credentials in its
    storage options are masked (a printed job lands in logs and issues) unless ``mask_secrets`` is False."""
    d = cfg.model_dump(mode="json")
    return yaml.safe_dump(_masked(d) if mask_secrets else d, sort_keys=False, allow_unicode=True,
                          default_flow_style=False)


# -- --set -------------------------------------------------------------------------------------
_KEY_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)")


def parse_key(key: str) -> tuple | None:
    """``inputs[0].format`` -> ``("inputs", 0, "format")``; None if it is not of that form."""
    loc: list = []
    for part in key.split("."):
        m = _KEY_PART.fullmatch(part)
        if not m:
            return None
        loc.append(m.group(1))
        loc += [int(i) for i in re.findall(r"\d+", m.group(2))]
    return tuple(loc)


def apply_overrides(raw: Any, overrides: Iterable[str], model: type[BaseModel]) -> tuple[Any, dict]:
    """``raw`` with each ``KEY=VALUE`` applied (VALUE parsed as YAML); also ``{loc: item}`` so an
    error in an overridden value names the ``--set`` it came from. Keys are checked against
    ``model`` first: an unknown one gets the same message as in a job file."""
    raw = {} if raw is None else raw
    origins: dict = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        loc = parse_key(key.strip()) if sep else None
        if not loc:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE with KEY a dotted path, e.g. --set run.steps=100 "
                              f"or --set inputs[0].format=jsonl")
        where = f"--set {item}"
        problem = _check_path(model, loc)
        if problem:
            raise ConfigError(f"{where}: {problem}")
        value = parse_yaml(text, where)
        raw = _set(raw, loc, value, where)
        origins[loc] = item
    return raw, origins


def _set(node: Any, loc: tuple, value: Any, where: str, at: tuple = ()) -> Any:
    """A copy of ``node`` with ``value`` at ``loc`` (mappings created on the way, lists indexed);
    ``at`` is where ``node`` is in the job, for the messages."""
    head, rest = loc[0], loc[1:]
    if isinstance(head, int):
        if not isinstance(node, list) or head >= len(node):
            n = len(node) if isinstance(node, list) else 0
            raise ConfigError(f"{where}: {format_loc(at + (head,))}: expected an index below {n} "
                              f"(the job's list has {n} entries), got {head}")
        out = list(node)
    else:
        if node is None:
            node = {}
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {format_loc(at) or 'job'}: expected a mapping, got {_show(node)}")
        out = dict(node)
    if rest:
        value = _set(out[head] if isinstance(head, int) or head in out else None, rest, value, where, at + (head,))
    out[head] = value
    return out


# -- validation and errors ---------------------------------------------------------------------
def validate(model: type[BaseModel], raw: Any, *, source: str | None = None, base_dir: str | None = None,
             origins: dict | None = None):
    """``model`` from parsed YAML; every problem found, as one `ConfigError` (``source: loc: ...; loc: ...``).

    A section validated on its own (``FuzzyDedupConfig``) is located under its ``SECTION`` key."""
    prefix = (model.SECTION,) if getattr(model, "SECTION", "") else ()
    try:
        return model.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as e:
        problems, errors = [], e.errors(include_url=False)
        for err in errors:
            if err["type"] == "too_short" and any(len(o["loc"]) > len(err["loc"]) and o["loc"][:len(err["loc"])] == err["loc"]
                                                  for o in errors):
                continue  # pydantic counts a list whose entries failed as empty: the entries' errors say it
            loc, message = describe_error(model, err)
            came = next((item for o, item in (origins or {}).items() if loc[:len(o)] == o), None)
            problems.append(f"{format_loc(prefix + loc) or 'job'}: {message}" + (f" (from --set {came})" if came else ""))
        raise ConfigError((f"{source}: " if source else "") + "; ".join(problems)) from None


def load(model: type[BaseModel], path: str, overrides: Iterable[str] = ()):
    """A job file with ``--set`` overrides applied; relative `ResolvedPath`s resolve against its directory."""
    raw = read_yaml(path)
    raw, origins = apply_overrides(raw, overrides, model)
    return validate(model, raw, source=path, base_dir=os.path.dirname(os.path.abspath(path)), origins=origins)


def format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe_error(model: type[BaseModel], err: dict) -> tuple[tuple, str]:
    """(location, ``expected ..., got ...``) for one pydantic error, phrased from the field's type."""
    loc, kind, ctx = tuple(err["loc"]), err["type"], err.get("ctx") or {}
    if kind == "config":
        return loc + tuple(ctx.get("at", ())), err["msg"]
    if kind == "extra_forbidden":
        return loc, _unknown_key(_annotation_at(model, loc[:-1]), loc[-1])
    if kind == "missing" and loc and isinstance(loc[-1], int):  # a fixed-length list that is too short
        loc, kind = loc[:-1], "too_short"
    ann = _annotation_at(model, loc)
    expected = describe(ann) if ann is not None else _FALLBACK.get(kind, err["msg"].removeprefix("Input should be "))
    if kind == "missing":
        return loc, f"expected {expected} (required), got nothing"
    return loc, f"expected {expected}, got {_show(err.get('input'))}"


def _check_path(model: type[BaseModel], loc: tuple) -> str | None:
    """None if ``loc`` names a field of ``model``; else the message a job file would get for it."""
    for i, part in enumerate(loc):
        parent = _annotation_at(model, loc[:i])
        if isinstance(part, str) and part not in getattr(_model_of(parent), "model_fields", {}):
            if _model_of(parent) is None:
                return f"{format_loc(loc[:i])}: expected {describe(parent)}, got a key below it ({part!r})"
            return f"{format_loc(loc[:i + 1])}: {_unknown_key(parent, part)}"
        if isinstance(part, int) and _element(parent, part) is None:
            return f"{format_loc(loc[:i])}: expected {describe(parent)}, got an index below it ([{part}])"
    return None


def _unknown_key(parent: Any, name: Any) -> str:
    cls = _model_of(parent)
    keys = list(cls.model_fields) if cls is not None else []
    close = difflib.get_close_matches(str(name), keys, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"expected one of the keys {', '.join(keys)}, got unknown key {name!r}{hint}"


_FALLBACK = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
             "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
             "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list", "tuple_type": "a list",
             "model_type": "a mapping", "dict_type": "a mapping", "model_attributes_type": "a mapping"}


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 80, 80, 80


def _show(value: Any) -> str:
    """A value in an error message: at most 80 characters, whatever its size (reprlib stops
    after a few entries and levels; ``repr`` of an aliased tree would expand all of it)."""
    text = _REPR.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- reading the models' annotations -----------------------------------------------------------
def _split(ann: Any) -> tuple[Any, list]:
    """(bare type, constraint metadata) of an annotation, through ``Annotated`` and ``Field``."""
    meta: list = []
    while typing.get_origin(ann) is Annotated:
        ann, *extra = typing.get_args(ann)
        for m in extra:
            meta += getattr(m, "metadata", None) or [m]  # Field(ge=1) holds Ge(1) in .metadata
    return ann, meta


def _optional(ann: Any) -> tuple[Any, bool]:
    if typing.get_origin(ann) in (Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return ann, False


def _model_of(ann: Any) -> type[BaseModel] | None:
    ann, _ = _optional(_split(ann)[0])
    ann = _split(ann)[0]
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _element(ann: Any, index: int) -> Any:
    ann, _ = _optional(_split(ann)[0])
    ann = _split(ann)[0]
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis or origin is list:
        return args[0]
    if origin is tuple:
        return args[index] if 0 <= index < len(args) else None
    return None


def _annotation_at(model: type[BaseModel], loc: tuple) -> Any:
    """The annotation (with its metadata) of the field at ``loc``; None where it cannot be followed."""
    ann: Any = model
    for part in loc:
        if isinstance(part, int):
            ann = _element(ann, part)
        else:
            cls = _model_of(ann)
            field = cls.model_fields.get(part) if cls is not None else None
            ann = Annotated[(field.annotation, *field.metadata)] if field is not None and field.metadata else (
                field.annotation if field is not None else None)
        if ann is None:
            return None
    return ann


def describe(ann: Any) -> str:
    """What a value of this annotation looks like, in words: ``an integer >= 1``, ``one of a, b``."""
    bare, meta = _split(ann)
    inner, nullable = _optional(bare)
    if nullable:
        inner_bare, inner_meta = _split(inner)
        return describe(Annotated[(inner_bare, *meta, *inner_meta)] if meta or inner_meta else inner_bare) + " or null"
    origin, args = typing.get_origin(bare), typing.get_args(bare)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if bare is bool:
        return "true or false"
    if bare in (int, float):
        return ("an integer" if bare is int else "a number") + _bounds(meta)
    if bare is str:
        return "a non-empty string" if any(getattr(m, "min_length", 0) for m in meta) else "a string"
    if origin in (tuple, list):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {len(args)} {_plural(args[0])}"
        return ("a non-empty list of " if any(getattr(m, "min_length", 0) for m in meta) else "a list of ") + _plural(args[0])
    if isinstance(bare, type) and issubclass(bare, BaseModel):
        return "a mapping"
    return "a value"


def _plural(ann: Any) -> str:
    bare = _split(ann)[0]
    if isinstance(bare, type) and issubclass(bare, BaseModel):
        return "mappings"
    return {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(bare, "values")


def _bounds(meta: list) -> str:
    lo = next(((m.ge, "[") for m in meta if isinstance(m, annotated_types.Ge)), None) or \
        next(((m.gt, "(") for m in meta if isinstance(m, annotated_types.Gt)), None)
    hi = next(((m.le, "]") for m in meta if isinstance(m, annotated_types.Le)), None) or \
        next(((m.lt, ")") for m in meta if isinstance(m, annotated_types.Lt)), None)
    if lo and hi:
        return f" in {lo[1]}{lo[0]}, {hi[0]}{hi[1]}"
    if lo:
        return f" {'>=' if lo[1] == '[' else '>'} {lo[0]}"
    if hi:
        return f" {'<=' if hi[1] == ']' else '<'} {hi[0]}"
    return ""
