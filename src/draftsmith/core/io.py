"""Atomic, durable file output: a reader sees the old file or the whole new one, never a torn one.

Everything is written to a temporary name in the destination's own directory (so the rename stays
on one filesystem), flushed to disk, renamed over the destination, and the directory entry itself is
flushed, so a power cut after return cannot bring back the old file or leave an empty one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.core.errors import DraftsmithError, InputError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(DraftsmithError):
    """The file system ran out of space (or quota) while writing: one line, exit 2."""


def disk_full(error: OSError, path: str | Path | None = None) -> DiskFullError:
    where = path or error.filename
    return DiskFullError(
        (f"{where}: " if where else "") + "the disk is full (no space left on device); free some space "
        "and rerun the same command (what was written before is kept)"
    )


def read_json_file(path: Path, what: str) -> Any:
    """A small JSON file, with errors that name it (``what``: "bench file", "model config")."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such {what}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None


def temporary_name(path: str | Path) -> Path:
    """``dir/.name.tmp``: hidden, and next to ``path`` (a same-filesystem rename)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp")


def fsync_dir(directory: str | Path) -> None:
    """Flush a directory's entries (renames, creations) to disk; a no-op where it is not supported."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse fsync on directories; nothing more can be done there
    finally:
        os.close(descriptor)


def fsync_tree(path: str | Path) -> None:
    """fsync a file, or every file and directory below a directory."""
    path = Path(path)
    if path.is_dir():
        for root, _, files in os.walk(path):
            for name in files:
                fsync_tree(Path(root) / name)
            fsync_dir(root)
        return
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def publish(temporary: str | Path, final: str | Path) -> Path:
    """Make a finished temporary file or directory durable and rename it to ``final`` atomically."""
    temporary, final = Path(temporary), Path(final)
    fsync_tree(temporary)
    os.replace(temporary, final)
    fsync_dir(final.parent)
    return final


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content to (with any writer); publish it on success.

    On an exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    temporary = temporary_name(path)
    try:
        yield temporary
        publish(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            raise disk_full(error, path) from None
        raise


def write_atomic(path: str | Path, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``data`` atomically and durably."""
    with atomic_path(path) as temporary:
        with open(temporary, "wb") as handle:
            handle.write(data.encode(encoding) if isinstance(data, str) else data)
    return Path(path)


def finite(value: Any) -> Any:
    """``value`` with every NaN/infinity replaced by None, so it can be written as strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps_json(payload: Any, indent: int | None = 2, **options: Any) -> str:
    """Strict JSON (RFC 8259: no NaN or Infinity, which most readers reject): a non-finite number
    is written as null. Every JSON file and `--json` output goes through here."""
    return json.dumps(finite(payload), indent=indent, allow_nan=False, **options)


def write_json_atomic(path: str | Path, payload: Any, indent: int | None = 2) -> Path:
    """``payload`` as strict JSON (with a final newline), written with `write_atomic`."""
    return write_atomic(path, dumps_json(payload, indent=indent) + "\n")
