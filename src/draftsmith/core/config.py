"""Stage configs are the single source of every command-line option.

A stage declares one pydantic model (a ``BaseModel`` or a ``pydantic.dataclasses.dataclass``); its
fields become the command's options: ``max_length`` -> ``--max-length``, the type picks the click
type, the default is shown, ``Field(description=...)`` (or the attribute docstring) is the help.
Booleans are ``--x/--no-x``, ``Literal`` fields are choices, lists take comma-separated values (and
may be repeated), dicts take a JSON object, nested models add their fields as ``--parent-field``.
``Annotated[..., Cli(...)]`` renames a flag, adds a short alias, makes it positional or hides it.

Every stage command also takes ``--config FILE`` (YAML, TOML or JSON) keyed like the flags (hyphens
or underscores, or the field names); flags given on the command line win over the file, the file
wins over the defaults. Values from both are validated by the model in one place,
``build_config``, which turns a ``ValidationError`` into one ``InputError`` line naming the flag (or
``FILE: key``) and the problem.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from draftsmith.core.config_file import read_config_file
from draftsmith.core.errors import InputError
from draftsmith.core.limits import MAX_BLOCK_SIZE, MAX_SEQUENCE_TOKENS, MAX_SETTING, check_threads


def _flags_show_no_value_type() -> None:
    """typer's rich help prints a value type beside every flag (`--help <bool>`, `--json <bool>`),
    though a flag takes no value; click's plain help leaves it out, and so do we."""
    option = typer.core.TyperOption
    shown = getattr(option, "display_type_rich", None)
    # Older typer builds (one ran on a GPU image here) have no such hook and print no type to hide.
    if shown is None or getattr(shown, "draftsmith_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag or self.count else shown(self, ctx)

    display_type_rich.draftsmith_flags = True
    option.display_type_rich = display_type_rich


_flags_show_no_value_type()


@dataclasses.dataclass(frozen=True)
class Cli:
    """How one config field appears on the command line (attach with ``Annotated[T, Cli(...)]``)."""

    flags: tuple[str, ...] = ()
    """Option names, e.g. ``("--output", "-o")`` or ``("--guard/--no-guard",)``; default from the field name."""
    positional: bool = False
    hidden: bool = False
    """Not a flag (still settable from ``--config FILE`` and the Python API)."""
    split: bool = True
    """List values are split at commas (off for values that contain commas themselves)."""
    envvar: str | None = None
    metavar: str | None = None
    help: str | None = None
    panel: str | None = None
    """The `--help` section this option is listed under (default: the model's `cli_panels`, else Options)."""


def cli(*flags: str, **options: Any) -> Cli:
    return Cli(flags=tuple(flags), **options)


# ---- the one dtype vocabulary ---------------------------------------------------------------------

DTYPE_NAMES: dict[str, str] = {
    "auto": "auto",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}


# Bytes per element of every dtype draftsmith sizes (hidden states on disk, memory plans); the
# storage-only spellings (8-bit) are not training/serving dtypes, so they are not in DTYPE_NAMES.
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}
STORAGE_DTYPE_NAMES: dict[str, str] = {
    **{name: canonical for name, canonical in DTYPE_NAMES.items() if canonical != "auto"},
    "float8": "float8_e4m3fn", "fp8": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "int8": "int8",
}


def dtype_bytes(name: Any) -> int:
    """Bytes per element of a dtype (any spelling in `STORAGE_DTYPE_NAMES`, ``torch.`` prefix allowed)."""
    canonical = STORAGE_DTYPE_NAMES.get(str(name).strip().lower().removeprefix("torch."))
    if canonical is None:
        raise InputError(f"unknown dtype {name!r} (use bfloat16, float16, float32 or float8)")
    return DTYPE_BYTES[canonical]


def canonical_dtype(name: Any, *, allow_auto: bool = True) -> str:
    """``bf16`` / ``bfloat16`` / ``torch.bfloat16`` -> ``bfloat16`` (likewise fp16, fp32, auto)."""
    text = str(name).strip().lower().removeprefix("torch.")
    canonical = DTYPE_NAMES.get(text)
    if canonical is None or (canonical == "auto" and not allow_auto):
        accepted = [key for key in DTYPE_NAMES if allow_auto or key != "auto"]
        raise ValueError(f"must be one of {', '.join(accepted)}, got {name!r}")
    return canonical


def torch_dtype(name: str):
    """The torch dtype of a (non-auto) dtype name from the vocabulary."""
    import torch

    return getattr(torch, canonical_dtype(name, allow_auto=False))


def cpu_multiplies_bf16_natively() -> bool:
    """Whether this CPU has bf16 matrix units (AMX tiles or AVX512-BF16), where bf16 training steps
    run several times faster than fp32 ones; elsewhere bf16 on the CPU is emulated and slower."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    return any(probe is not None and probe() for probe in probes)


DType = Annotated[str, BeforeValidator(canonical_dtype), Cli(metavar="DTYPE")]
"""A dtype field: accepts every spelling in ``DTYPE_NAMES``, stores the long name (or ``auto``)."""
StorageDType = Annotated[
    str, BeforeValidator(lambda value: canonical_dtype(value, allow_auto=False)), Cli(metavar="DTYPE")
]
"""A dtype that must be concrete (no ``auto``)."""


# ---- bounded numbers (core.limits says why each ceiling is where it is) ---------------------------

Threads = Annotated[int, AfterValidator(check_threads)]
"""A torch CPU thread count: 1 up to `MAX_THREADS_PER_CPU` per CPU this process may use."""
BlockSize = Annotated[int, Field(ge=2, le=MAX_BLOCK_SIZE)]
"""A draft block: the anchor plus at least one drafted token, at most `MAX_BLOCK_SIZE`."""
SequenceTokens = Annotated[int, Field(ge=1, le=MAX_SEQUENCE_TOKENS)]
"""A token count of one sequence (a length, a cap on new tokens, a window): at most `MAX_SEQUENCE_TOKENS`."""


# ---- reading a model's fields ---------------------------------------------------------------------


@dataclasses.dataclass
class Option:
    """One command-line option (or argument) mapped to a (possibly nested) config field."""

    path: tuple[str, ...]
    kind: str  # bool, choice, list, dict, scalar
    python_type: Any
    info: FieldInfo
    spec: Cli
    choices: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        return "__".join(self.path)

    @property
    def flag(self) -> str:
        if self.spec.positional:
            return self.param.upper()
        names = self.spec.flags or (f"--{'-'.join(self.path).replace('_', '-')}",)
        return names[0].split("/")[0]

    def keys(self) -> set[str]:
        """Names a config file may use for this option."""
        keys = {".".join(self.path), "__".join(self.path), "-".join(self.path)}
        keys.add(self.flag.lstrip("-").lower())
        for name in self.spec.flags:
            for part in name.split("/"):
                if part.startswith("--") and not part.startswith("--no-"):
                    keys.add(part[2:])
        return {key.replace("_", "-") for key in keys}

    def typer_default(self) -> Any:
        """The default click shows; whether a value was given is read from click, not compared to it."""
        default = self.info.get_default(call_default_factory=True)
        if default is None or self.info.is_required() or default is dataclasses.MISSING:
            return None
        if self.kind == "list":
            return [str(item) for item in default] or None
        if self.kind == "dict":
            return [json.dumps(default)] if default else None
        return default

    def typer_param(self) -> inspect.Parameter:
        help_text = self.spec.help or self.info.description or ""
        if self.info.is_required():
            help_text = f"{help_text} [required]".strip()
        annotation: Any = self.python_type
        extra: dict[str, Any] = {}
        if self.kind == "bool":
            annotation = bool
        elif self.kind == "choice":
            annotation = str  # pydantic checks the choice, so a file value gets the same message
            extra["metavar"] = "[" + "|".join(self.choices) + "]"
        elif self.kind == "list":
            annotation = list[str]
            extra["metavar"] = "A,B,..."
        elif self.kind == "dict":
            annotation = list[str]
            extra["metavar"] = "JSON|KEY=VALUE"
        if self.spec.metavar:
            extra["metavar"] = self.spec.metavar
        if self.spec.positional:
            extra["metavar"] = self.flag
            info = typer.Argument(None, help=help_text, show_default=False, **extra)
        else:
            names = self.spec.flags or (
                f"--{'-'.join(self.path).replace('_', '-')}" + (
                    f"/--no-{'-'.join(self.path).replace('_', '-')}" if self.kind == "bool" else ""
                ),
            )
            info = typer.Option(
                self.typer_default(),
                *names,
                help=help_text,
                show_default=self.kind != "bool",
                envvar=self.spec.envvar,
                rich_help_panel=self.spec.panel,
                **extra,
            )
        return inspect.Parameter(
            self.param, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation | None
        )

    def coerce(self, value: Any, where: str) -> Any:
        """A raw flag or file value -> what the model validates (strings split / parsed as JSON)."""
        if self.kind == "list":
            items = value if isinstance(value, (list, tuple)) else [value]
            if self.spec.split:
                items = [part.strip() if isinstance(part, str) else part
                         for item in items for part in (item.split(",") if isinstance(item, str) else [item])]
                if "" in items and _is_number_type(_element_type(self.info.annotation)):
                    # "0.5,,0.2" is a slip, and dropping the gap would move 0.2 to another position
                    raise InputError(f"{where} {','.join(map(str, items))!r}: item {items.index('') + 1} is empty "
                                     f"(two commas in a row?)")
                items = [item for item in items if item != ""]
            return list(items)
        if self.kind == "dict":
            if isinstance(value, dict):
                return value
            merged: dict[str, Any] = {}
            for item in value if isinstance(value, (list, tuple)) else [value]:
                merged.update(_parse_mapping(str(item), where))
            return merged
        return value


def _parse_mapping(text: str, where: str) -> dict[str, Any]:
    """A JSON object, or one ``KEY=VALUE`` pair whose value is JSON when it parses (else a string)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(parsed, dict):
            raise InputError(f"{where}: must be a JSON object")
        return parsed
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise InputError(f"{where} {text!r}: expected a JSON object or KEY=VALUE (VALUE as JSON, e.g. enable_thinking=true)")
    try:
        return {key: json.loads(raw)}
    except json.JSONDecodeError:
        return {key: raw}


def _fields(model: type) -> dict[str, FieldInfo]:
    fields = getattr(model, "__pydantic_fields__", None)
    if fields is None:
        raise TypeError(f"{model!r} is not a pydantic model or pydantic dataclass")
    return fields


def _is_model(annotation: Any) -> bool:
    return inspect.isclass(annotation) and hasattr(annotation, "__pydantic_fields__")


def _strip_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        # "one or many" fields (``list[Path] | Path``) take the list form on the command line
        listed = [arg for arg in members if typing.get_origin(arg) in (list, tuple)]
        if len(members) == 1 or listed:
            return (listed or members)[0]
        return annotation
    return annotation


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    metadata: list[Any] = []
    while typing.get_origin(annotation) is Annotated:
        metadata.extend(annotation.__metadata__)
        annotation = annotation.__origin__
    return annotation, metadata


def _panels_of(model: type) -> dict[str, str]:
    """Field name -> `--help` section, from the model's optional ``cli_panels = {"Section": ("field", ...)}``."""
    declared = getattr(model, "cli_panels", None) or {}
    fields = _fields(model)
    panels = {}
    for panel, names in declared.items():
        for name in names:
            if name not in fields:
                raise TypeError(f"{model.__name__}.cli_panels[{panel!r}] names {name!r}, which is not a field")
            panels[name] = panel
    return panels


def options_of(model: type, prefix: tuple[str, ...] = (), panel: str | None = None) -> Iterator[Option]:
    """The command-line options of a config model, nested models flattened (into their field's panel)."""
    panels = _panels_of(model)
    for name, info in _fields(model).items():
        annotation, metadata = _unwrap(info.annotation)
        metadata = [*metadata, *info.metadata]
        spec = next((item for item in reversed(metadata) if isinstance(item, Cli)), Cli())
        if spec.hidden or info.init is False or name.startswith("_"):
            continue
        base = _strip_optional(annotation)
        base, more = _unwrap(base)
        spec = next((item for item in reversed(more) if isinstance(item, Cli)), spec)
        if spec.panel is None and (name in panels or panel is not None):
            spec = dataclasses.replace(spec, panel=panels.get(name, panel))
        path = (*prefix, name)
        if _is_model(base):
            yield from options_of(base, path, spec.panel)
            continue
        origin = typing.get_origin(base)
        if base is bool:
            yield Option(path, "bool", bool, info, spec)
        elif origin is Literal:
            yield Option(path, "choice", str, info, spec, tuple(str(arg) for arg in typing.get_args(base)))
        elif origin in (list, tuple, set, frozenset) or base in (list, tuple):
            yield Option(path, "list", list, info, spec)
        elif origin is dict or base is dict:
            yield Option(path, "dict", dict, info, spec)
        elif base in (int, float, str, Path):
            yield Option(path, "scalar", base, info, spec)
        else:
            yield Option(path, "scalar", str, info, spec)


# ---- config files ---------------------------------------------------------------------------------


def _flatten_file(data: Mapping[str, Any], nested: set[str], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        name = f"{prefix}{str(key).replace('_', '-')}"
        if isinstance(value, dict) and name in nested:
            yield from _flatten_file(value, nested, f"{name}-")
        else:
            yield name, value


# ---- validation ---------------------------------------------------------------------------------


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        data = data.setdefault(part, {})
    data[path[-1]] = value


def _validate(model: type, data: dict[str, Any]) -> Any:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model.model_validate(data)
    return TypeAdapter(model).validate_python(data)


# ---- the one number rule ----------------------------------------------------------------------------
# Every stage's numbers pass here: a NaN or an infinity is never a setting (it would land in
# manifest.json, and the same command could then never resume), nor is a number past MAX_SETTING
# (torch wraps 2**63 negative; core.limits), a boolean is not a number (`max_tokens: true` is a
# typo, not 1), and a sampling temperature is never negative. A field's own range (`le=`, the
# bounded types above) is pydantic's to check, on every path a config is built by.


def _members(annotation: Any) -> tuple[Any, ...]:
    annotation, _ = _unwrap(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(member for arg in typing.get_args(annotation) for member in _members(arg))
    return (annotation,)


def _is_number_type(annotation: Any) -> bool:
    members = _members(annotation)
    return bool(bool not in members and {int, float} & set(members))


def _element_type(annotation: Any) -> Any | None:
    """The item type of a list/tuple field (``tuple[int, ...]``), if every member agrees on one."""
    for member in _members(annotation):
        if typing.get_origin(member) in (list, tuple, set, frozenset):
            args = [arg for arg in typing.get_args(member) if arg is not Ellipsis]
            if args:
                return args[0]
    return None


def _reject_bools(model: type, data: Mapping[str, Any], name_of: Callable[[tuple], str | None], prefix: tuple = ()) -> None:
    """A JSON/YAML/TOML or Python ``true`` given where a number goes is refused, not read as 1."""
    fields = getattr(model, "__pydantic_fields__", None) or {}
    for name, info in fields.items():
        if name not in data:
            continue
        value, path = data[name], (*prefix, name)
        nested = next((member for member in _members(info.annotation) if _is_model(member)), None)
        if nested is not None and isinstance(value, Mapping):
            _reject_bools(nested, value, name_of, path)
            continue
        element = _element_type(info.annotation)
        items = value if element is not None and isinstance(value, (list, tuple)) else None
        if isinstance(value, bool) and _is_number_type(info.annotation) or (
            items is not None and _is_number_type(element) and any(isinstance(item, bool) for item in items)
        ):
            where = name_of(path) or f"--{'-'.join(path).replace('_', '-')}"
            raise InputError(f"{where}: expected a number, got a boolean ({json.dumps(value)})")


def _number_problem(name: str, value: float) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number (got {value})"
    if abs(value) > MAX_SETTING:
        shown = f"{value:.3g}" if isinstance(value, float) or abs(value) < 10**300 else f"a {len(str(abs(value)))}-digit number"
        return f"{shown} is beyond any setting (at most {MAX_SETTING:.0e})"
    if name.endswith("temperature") and value < 0:
        return f"a temperature must be >= 0 (got {value})"
    return None


def _walk_numbers(value: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        problem = _number_problem(path[-1] if path else "", value)
        if problem:
            yield path, problem
    elif isinstance(value, BaseModel) or dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name in getattr(type(value), "__pydantic_fields__", None) or {f.name: f for f in dataclasses.fields(value)}:
            yield from _walk_numbers(getattr(value, name, None), (*path, name))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk_numbers(item, (*path, str(key)))
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _walk_numbers(item, path)


def check_numbers(config: Any, name_of: Callable[[tuple], str | None] | None = None) -> Any:
    """Refuse a built config (any stage's) holding a NaN/inf, or a negative temperature; returns it.

    Called by `build_config` and `validate_config`; a stage's Python API may call it on a config
    built directly."""
    for path, problem in _walk_numbers(config, ()):
        where = (name_of(path) if name_of else None) or f"--{'-'.join(path[:1]).replace('_', '-')}" + (
            "." + ".".join(path[1:]) if len(path) > 1 else "")
        raise InputError(f"{where}: {problem}")
    return config


def _validate_numbers(model: type, data: dict[str, Any], name_of: Callable[[tuple], str | None]) -> Any:
    _reject_bools(model, data, name_of)
    try:
        config = _validate(model, data)
    except ValidationError as error:
        raise InputError(describe_validation_error(error, name_of)) from None
    return check_numbers(config, name_of)


def describe_validation_error(error: ValidationError, name_of: Callable[[tuple], str | None] | None = None) -> str:
    """One line: ``--lr: Input should be greater than 0; --dtype must be one of ...``."""
    problems = []
    for item in error.errors():
        loc = tuple(str(part) for part in item.get("loc", ()))
        where = name_of(loc) if name_of else None
        if where is None and loc:
            where = f"--{loc[0].replace('_', '-')}" if name_of is None else ".".join(loc)
        message = str(item.get("msg", "invalid"))
        if item.get("type") == "value_error":
            message = message.removeprefix("Value error, ")
            problems.append(f"{where} {message}" if where else message)
        elif item.get("type") == "missing":
            problems.append(f"{where} is required" if where else "a required value is missing")
        else:
            shown = item.get("input")
            suffix = f" (got {shown!r})" if isinstance(shown, (str, int, float)) and item.get("type") != "missing" else ""
            problems.append(f"{where}: {message}{suffix}" if where else f"{message}{suffix}")
    return "; ".join(problems)


def validate_config(model: type, data: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> Any:
    """`model` from a plain dict (a notebook's, a file's), pydantic's errors made one `InputError`
    line naming each field as its flag (`flags` renames those whose flag is not the field name)."""

    # A field is named as its command-line flag (`num_threads` is `--threads`) where the model has one.
    named = {option.path[0]: option.flag for option in options_of(model) if len(option.path) == 1} if _is_model(model) else {}

    def name_of(loc: tuple) -> str | None:
        return (flags or {}).get(loc[0]) or named.get(loc[0]) or f"--{loc[0].replace('_', '-')}" if loc else None

    return _validate_numbers(model, dict(data), name_of)


def build_config(
    model: type,
    flags: Mapping[str, Any] | None = None,
    config_file: str | Path | None = None,
    *,
    base: Mapping[str, Any] | None = None,
) -> Any:
    """The stage config from defaults < ``base`` < ``config_file`` < ``flags`` (param name -> value, None = not given)."""
    options = list(options_of(model))
    by_param = {option.param: option for option in options}
    data: dict[str, Any] = {}
    source: dict[tuple[str, ...], str] = {}
    for key, value in (base or {}).items():
        data[key] = value
    if config_file is not None:
        raw = read_config_file(config_file)
        by_key: dict[str, Option] = {}
        for option in options:
            for key in option.keys():
                by_key.setdefault(key, option)
        nested = {"-".join(option.path[:depth]).replace("_", "-") for option in options for depth in range(1, len(option.path))}
        hidden = {name.replace("_", "-"): name for name in _fields(model) if name not in {o.path[0] for o in options}}
        for key, value in _flatten_file(raw, nested):
            option = by_key.get(key)
            if option is None:
                if key in hidden:  # settable from a file, not a flag
                    data[hidden[key]] = value
                    source[(hidden[key],)] = f"{config_file}: {key}"
                    continue
                known = ", ".join(sorted(by_key))
                raise InputError(f"{config_file}: unknown key {key!r} (known keys: {known})")
            where = f"{config_file}: {key}"
            _set(data, option.path, option.coerce(value, where))
            source[option.path] = where
    for param, value in (flags or {}).items():
        option = by_param.get(param)
        if option is None or value is None or (option.kind == "list" and len(value) == 0):
            continue
        _set(data, option.path, option.coerce(value, option.flag))
        source[option.path] = option.flag

    def name_of(loc: tuple) -> str | None:
        for depth in range(len(loc), 0, -1):
            path = tuple(loc[:depth])
            if path in source:
                return source[path]
            for option in options:
                if option.path == path:
                    return option.flag
        return None

    return _validate_numbers(model, data, name_of)


# ---- typer commands -------------------------------------------------------------------------------


def config_command(
    app: typer.Typer,
    name: str,
    model: type,
    run: Callable[..., Any],
    *,
    extras: Mapping[str, tuple[Any, Any]] | None = None,
    epilog: str | None = None,
    help: str | None = None,
    own_config_file: bool = False,
) -> Callable[..., Any]:
    """Register ``name`` on ``app``: options from ``model`` plus ``--config FILE``; calls ``run(config, **extras)``.

    ``extras`` are command-only switches that are not part of the stage's settings (``--json``):
    name -> (annotation, ``typer.Option(...)``). With ``own_config_file`` the stage reads
    ``--config FILE`` itself (``run(config, config_file=...)``) and ``model`` holds the flags only.
    """
    options = list(options_of(model))
    extras = dict(extras or {})
    parameters = [option.typer_param() for option in options]
    parameters.append(
        inspect.Parameter(
            "config_file",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(
                None, "--config", metavar="FILE",
                help="YAML, TOML or JSON file keyed like these flags; flags given here override it.",
            ),
            annotation=Path | None,
        )
    )
    for extra_name, (annotation, info) in extras.items():
        parameters.append(inspect.Parameter(extra_name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation))
    parameters.append(inspect.Parameter("cli_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
    # typer orders click arguments by signature order; arguments first keeps `--help` readable
    parameters.sort(key=lambda parameter: not isinstance(parameter.default, typer.models.ArgumentInfo))

    def command(**values: Any) -> Any:
        config_file = values.pop("config_file")
        extra_values = {key: values.pop(key) for key in extras}
        context = values.pop("cli_context")
        # Only what the user typed (or set through an envvar) overrides the file; click shows the defaults.
        given = {"COMMANDLINE", "ENVIRONMENT", "PROMPT"}
        values = {
            key: value for key, value in values.items()
            if getattr(context.get_parameter_source(key), "name", None) in given
        }
        if own_config_file:
            return run(build_config(model, values), config_file=config_file, **extra_values)
        return run(build_config(model, values, config_file), **extra_values)

    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    command.__doc__ = help or run.__doc__
    command.__name__ = f"{name.replace('-', '_')}_command"
    command.config_model = model  # type: ignore[attr-defined]  # which settings a command takes (tests walk them)
    return app.command(name, epilog=epilog)(command)
