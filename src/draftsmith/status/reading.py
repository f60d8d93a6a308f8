"""Reading what a live writer is writing, without disturbing it: no lock, nothing written, a
half-written last line (no newline yet) left for the next look.

Every file status opens goes through the shared readers (`draftsmith.core.readers`): a regular file
or one line naming what is there instead (a FIFO would block status, a link to /dev/zero would never
end), JSON files bounded in size and depth, and a JSONL line longer than the row-size limit skipped
without being held."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.core.limits import max_row_bytes
from draftsmith.core.lock import lock_holder
from draftsmith.core.readers import BadJSONError, open_regular
from draftsmith.core.readers import read_json as read_json_value

_BLOCK = 1 << 20


def complete_lines(path: Path, offset: int = 0) -> Iterator[bytes]:
    """The complete lines of `path` from byte `offset` up to its size when opened (what is appended
    meanwhile is for the next look; a torn or still-growing last line is not a line yet). A line over
    the row-size limit is skipped unread."""
    limit = max_row_bytes()
    descriptor = open_regular(path)
    with os.fdopen(descriptor, "rb") as handle:
        left = max(0, os.fstat(descriptor).st_size - offset)
        handle.seek(offset)
        pending, skipping = b"", False
        while left > 0 and (block := handle.read(min(_BLOCK, left))):
            left -= len(block)
            lines = (pending + block).split(b"\n")
            pending = lines.pop()
            if skipping and lines:  # the end of an oversized line: drop its rest
                lines, skipping = lines[1:], False
            yield from (line for line in lines if line.strip() and len(line) <= limit)
            if len(pending) > limit:
                pending, skipping = b"", True


def json_lines(path: Path, offset: int = 0) -> Iterator[dict[str, Any]]:
    """The JSON objects among the complete lines of `path` (a line that is not one is skipped: a
    crash can leave a garbled line, which the writer's own resume repairs)."""
    for line in complete_lines(path, offset):
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            yield value


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file written atomically by a stage, or None (absent, damaged, or not an object);
    a FIFO, a device or an oversized file at its name is an `InputError` naming it."""
    try:
        value = read_json_value(path, missing_ok=True)
    except BadJSONError:
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
