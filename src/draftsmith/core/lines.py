"""JSONL lines read as bytes: invalid UTF-8 names its file and line, and an oversized line is
measured and skipped without ever being held whole in memory.

Every stage that reads JSONL goes through `iter_lines`, so "file:line: not valid UTF-8" and the
row-size limit mean the same everywhere.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.errors import InputError

_SKIP_BLOCK = 1 << 20


@dataclass(frozen=True)
class OversizedLine:
    """A line longer than the limit: only its length was read."""

    size: int


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb")


def decode_line(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = raw[error.start : error.start + 4]
        raise InputError(f"{where}: not valid UTF-8 (byte {error.start} of the line: {bad!r}); JSONL must be UTF-8") from None


def iter_lines(path: str | os.PathLike, max_line_bytes: int | None = None) -> Iterator[tuple[int, str | OversizedLine]]:
    """(line number, text) for every non-blank line; `OversizedLine` for one over `max_line_bytes`."""
    path = Path(path)
    with _open_binary(path) as handle:
        number = 0
        while True:
            raw = handle.readline(max_line_bytes + 1) if max_line_bytes else handle.readline()
            if not raw:
                return
            number += 1
            if max_line_bytes and len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                size = len(raw)
                while True:  # skip to the end of the line, a block at a time
                    more = handle.readline(_SKIP_BLOCK)
                    size += len(more)
                    if not more or more.endswith(b"\n"):
                        break
                yield number, OversizedLine(size)
                continue
            if raw.strip():
                yield number, decode_line(raw, f"{path}:{number}")
