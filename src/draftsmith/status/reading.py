"""Reading what a live writer is writing, without disturbing it: no lock, nothing written, a
half-written last line (no newline yet) left for the next look."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.core.lock import lock_holder

_BLOCK = 1 << 20


def complete_lines(path: Path, offset: int = 0) -> Iterator[bytes]:
    """The complete lines of `path` from byte `offset` on (a torn or still-growing last line is not one)."""
    with path.open("rb") as handle:
        handle.seek(offset)
        pending = b""
        while block := handle.read(_BLOCK):
            lines = (pending + block).split(b"\n")
            pending = lines.pop()
            yield from (line for line in lines if line.strip())


def json_lines(path: Path, offset: int = 0) -> Iterator[dict[str, Any]]:
    """The JSON objects among the complete lines of `path` (a line that is not one is skipped: a
    crash can leave a garbled line, which the writer's own resume repairs)."""
    for line in complete_lines(path, offset):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file written atomically by a stage, or None (absent, or not an object)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def list_directory(directory: Path) -> list[str]:
    """The names in `directory`, or a one-line error naming it."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        raise InputError(f"{directory}: no such directory") from None
    except NotADirectoryError:
        raise InputError(f"{directory}: not a directory (status reads a stage's output directory)") from None
    except PermissionError:
        raise InputError(f"{directory}: cannot be read (permission denied)") from None


def newest_mtime(paths: list[Path]) -> float | None:
    times = []
    for path in paths:
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(times, default=None)


def describe_writer(lock_path: Path) -> tuple[bool | None, str]:
    """(alive, words) for the writer recorded in a stage's lock file (read, never taken)."""
    holder = lock_holder(lock_path)
    if holder["pid"] is None:
        return False, "none (no run holds the lock)"
    if holder["alive"] is None:
        return None, f"pid {holder['pid']} on {holder['host']} (another host: judged by its last write)"
    return holder["alive"], f"pid {holder['pid']} on {holder['host']} " + ("alive" if holder["alive"] else "dead")
