"""Reading a file that someone else may have put at a name draftsmith knows: plain files only, a
bounded number of bytes, and JSON of a bounded depth.

A stage file, a lock, a manifest or a model's `config.json` is opened without blocking and checked
to be a regular file before a byte is read, so a FIFO at that name (which would block the reader
forever) or a link to a device like /dev/zero (which never ends) is one line naming the file. A
file over its size limit is refused without being read whole. JSON nested deeper than
`MAX_JSON_DEPTH` is refused before parsing: Python's parser would raise RecursionError on it, and
everything that walks a parsed value (number checks, the strict-JSON writer) recurses as well.

    data = read_json(path, "run manifest")                  # InputError naming the file on any fault
    record = read_json(path, "progress record", missing_ok=True)   # None when absent
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from itertools import accumulate
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError

#: The largest JSON file a reader takes (a model config, a manifest, a progress record are far smaller).
MAX_JSON_BYTES = 64 * 1024 * 1024
#: The deepest nesting of arrays and objects a JSON reader takes; draftsmith's own files and model
#: configs nest a handful of levels, and this stays far below Python's recursion limit.
MAX_JSON_DEPTH = 100

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


class BadJSONError(InputError):
    """A file that is there and readable but does not hold the JSON expected (a reader that falls
    back on a damaged file catches this, and lets every other `InputError` through)."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor for ``path`` if it is a regular file (links followed); else an
    `InputError` naming it. Opened without blocking, so a FIFO nobody writes is refused, not waited on.
    A missing file raises FileNotFoundError (callers decide what absence means)."""
    path = Path(path)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as error:
        if error.errno == errno.ENOTDIR:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path)) from None
        if error.errno == errno.ENXIO:  # a socket file, or a FIFO opened for writing only
            raise InputError(f"{path}: not a regular file (a socket or FIFO); draftsmith reads only plain files there") from None
        raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise InputError(f"{path}: not a regular file ({_kind(mode)}); draftsmith reads only plain files there: move it away")
    os.set_blocking(descriptor, True)
    return descriptor


def read_regular_bytes(path: str | os.PathLike, max_bytes: int, *, truncate: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (see `open_regular`), at most ``max_bytes`` of them:
    a longer file is an `InputError` naming it, or with ``truncate`` its first ``max_bytes``."""
    descriptor = open_regular(path)
    try:
        with os.fdopen(descriptor, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as error:
        raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
    if len(data) > max_bytes:
        if truncate:
            return data[:max_bytes]
        raise InputError(f"{path}: larger than {max_bytes:,} bytes, more than this file can hold; refusing to read it")
    return data


# A JSON string (escapes included), so brackets inside strings are not counted as nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``data`` (0 for a scalar)."""
    if data.count(b"[") + data.count(b"{") <= 1:
        return data.count(b"[") + data.count(b"{")
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", data)).translate(_STEP)
    return max(accumulate(step - 1 for step in brackets), default=0)


def loads_json(data: str | bytes, where: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON text from ``where`` (a file name, for the error): `BadJSONError` for text that is
    not UTF-8, not JSON, or nested deeper than ``max_depth``."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") > max_depth and (depth := json_depth(raw)) > max_depth:
        raise BadJSONError(f"{where}: JSON nested {depth:,} levels deep (at most {max_depth} are read); not a file draftsmith reads")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadJSONError(f"{where}: not UTF-8 text (byte {error.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise BadJSONError(f"{where}:{error.lineno}: invalid JSON ({error.msg})") from None
    except ValueError as error:  # an integer too long to convert
        raise BadJSONError(f"{where}: invalid JSON ({error})") from None
    except RecursionError:
        raise BadJSONError(f"{where}: JSON nested too deep to read; not a file draftsmith reads") from None


def read_json(path: str | os.PathLike, what: str = "JSON file", *, max_bytes: int = MAX_JSON_BYTES,
              missing_ok: bool = False, max_depth: int = MAX_JSON_DEPTH) -> Any:  # fmt: skip
    """The JSON value in the regular file ``path``: every fault an `InputError` naming the file
    (`BadJSONError` for the content); an absent file is "no such ``what``", or None with ``missing_ok``."""
    try:
        data = read_regular_bytes(path, max_bytes)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise InputError(f"{path}: no such {what}") from None
    return loads_json(data, str(path), max_depth)
