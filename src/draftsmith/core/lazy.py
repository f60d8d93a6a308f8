"""Package namespaces whose names import on first use (PEP 562).

A package's `__init__` that imported its torch-heavy modules eagerly would make every command,
`draftsmith --help` included, pay seconds for torch and transformers; `lazy_exports` lets a package
list what it exports without importing any of it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, homes: dict[str, str]) -> tuple[Callable[[str], Any], list[str]]:
    """`(__getattr__, __all__)` for `package`, where `homes` maps each exported name to the module
    that defines it (a full dotted name, or a submodule name relative to `package`)."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        home = homes[name]
        return getattr(importlib.import_module(home if "." in home else f"{package}.{home}"), name)

    return __getattr__, sorted(homes)


def require_optional(module: str, flag: str, extra: str) -> None:
    """Refuse an option whose optional package is missing before any work starts, naming the extra."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        from draftsmith.core.errors import InputError

        raise InputError(f"{flag} needs the {module} package, which is not installed: pip install 'draftsmith[{extra}]'")
