"""Reading a ``--config FILE`` (YAML, TOML or JSON) into a mapping, refusing what cannot be sane.

Three guards keep a config file from hanging or exhausting a run before it starts:

* a size limit (``MAX_CONFIG_BYTES``): a config file is settings, not data;
* YAML aliases are counted while the document is composed, before any Python object is built: a
  document whose aliases expand past ``MAX_EXPANDED_NODES`` values (a "billion laughs") is refused
  in milliseconds, instead of being expanded later by whatever walks it. Parsing stays in Python,
  so Ctrl-C and SIGTERM stop it like any stage;
* ``${NAME}`` in a string value is replaced by the environment variable ``NAME`` (``$${`` is a
  literal ``${``); an unset variable is refused naming the file, the key and the variable, rather
  than sent on as, say, a host name.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from draftsmith.core.errors import InputError

MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_EXPANDED_NODES = 1_000_000
_VARIABLE = re.compile(r"\$(\$?)\{([^}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """How many nodes ``root`` stands for with every alias expanded (stops counting past ``limit``).

    An alias is the same node object as its anchor, so sizes are memoised per node: linear in the
    composed document, however large its expansion."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if children_done:
            sizes[id(node)] = min(limit + 1, 1 + sum(sizes[id(child)] for child in children))
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def _load_yaml(text: str, where: Path) -> Any:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, MAX_EXPANDED_NODES)
        if size > MAX_EXPANDED_NODES:
            raise InputError(
                f"{where}: YAML aliases expand to more than {MAX_EXPANDED_NODES:,} values; refused "
                "(an alias bomb, or data that does not belong in a config file)"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _text(value: Any, where: Path, key: str) -> Any:
    """`value`, refused when it is a string no file name or setting can hold (a lone UTF-16
    surrogate, which JSON and YAML escapes can produce)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            # The key path holds the file's own key names: escaped where they would break the one line.
            shown = (key if key.isprintable() else ascii(key)) if key else "a key"
            raise InputError(f"{where}: {shown}: not valid text (a lone UTF-16 surrogate {ascii(value[error.start])})") from None
    return value


def _expand_variables(value: Any, where: Path, key: str) -> Any:
    if isinstance(value, dict):
        return {_text(name, where, key): _expand_variables(item, where, f"{key}.{name}" if key else str(name))
                for name, item in value.items()}
    if isinstance(value, list):
        return [_expand_variables(item, where, f"{key}[{index}]") for index, item in enumerate(value)]
    if not isinstance(value, str) or "${" not in _text(value, where, key):
        return value

    def replace(match: re.Match) -> str:
        escaped, name = match.groups()
        if escaped:
            return "${" + name + "}"
        if not _NAME.fullmatch(name):
            raise InputError(f"{where}: {key}: '${{{name}}}' is not an environment variable name (write $${{ for a literal ${{)")
        if name not in os.environ:
            raise InputError(f"{where}: {key}: environment variable {name} is not set (the value uses ${{{name}}})")
        return os.environ[name]

    return _VARIABLE.sub(replace, value)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML, TOML or JSON config file, ``${NAME}`` expanded."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such config file")
    with path.open("rb") as handle:
        raw = handle.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise InputError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; a config file holds settings, not data")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not valid UTF-8 (byte 0x{error.object[error.start]:02x}); save the file as UTF-8") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = _load_yaml(text, path)
        else:
            raise InputError(f"{path}: unknown config format {suffix!r} (use .yaml, .yml, .toml or .json)")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise InputError(f"{path}: cannot parse ({first_line})") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to be a config file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of settings at the top level")
    return _expand_variables(data, path, "")
