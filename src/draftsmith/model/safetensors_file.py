"""A safetensors file's header, checked whole before any library reads a tensor from it.

Weights come from outside (a download, a copy, a checkpoint cut short by a full disk or a kill), and
the readers that trust the header (the resume fingerprint seeks to its offsets; safetensors and
transformers each report a bad one their own way, some as a traceback) should all meet one check:
an 8-byte length, a JSON object, and for every tensor a known dtype, a shape and ``data_offsets``
that agree with each other, tile the data section without gaps or overlaps and end exactly at the
end of the file. Anything else is one `InputError` line naming the file and the problem.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError

# Bytes per element; packed sub-byte types (F4, F6) are checked by their offsets only.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "C64": 8, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
PACKED_DTYPES = ("F4", "F6_E2M3", "F6_E3M2")
MAX_HEADER_BYTES = 100 << 20  # the format's own limit


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    length: int  # bytes of the JSON header
    tensors: dict[str, dict[str, Any]]  # name -> {"dtype", "shape", "data_offsets"}
    metadata: dict[str, Any]

    @property
    def data_start(self) -> int:
        return 8 + self.length

    def spans(self) -> list[tuple[int, int]]:
        """The tensors' (begin, end) byte ranges within the data section, in file order."""
        return sorted(tuple(entry["data_offsets"]) for entry in self.tensors.values())


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_tensor(name: str, entry: Any) -> str | None:
    """The problem with one tensor's header entry, or None."""
    if not isinstance(entry, dict):
        return f"tensor {name!r}: its entry is not an object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES and dtype not in PACKED_DTYPES:
        return f"tensor {name!r}: unknown dtype {dtype!r}"
    if not isinstance(shape, list) or not all(_is_count(size) for size in shape):
        return f"tensor {name!r}: shape {shape!r} is not a list of sizes"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(offset) for offset in offsets)):
        return f"tensor {name!r}: data_offsets {offsets!r} are not two byte offsets"
    begin, end = offsets
    if end < begin:
        return f"tensor {name!r}: data_offsets [{begin}, {end}] end before they begin"
    if dtype in DTYPE_BYTES and end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
        return (f"tensor {name!r}: {dtype} of shape {shape} needs {math.prod(shape) * DTYPE_BYTES[dtype]} bytes, "
                f"its data_offsets [{begin}, {end}] hold {end - begin}")
    return None


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """The checked header of ``path`` (see the module docstring); an `InputError` naming it otherwise."""
    path = Path(path)

    def bad(problem: str) -> InputError:
        return InputError(f"{path}: not a readable safetensors file, truncated or corrupt ({problem})")

    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            raw = handle.read(length) if length is not None and length <= min(size - 8, MAX_HEADER_BYTES) else b""
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except OSError as error:
        raise InputError(f"{path}: cannot be read ({error.strerror or error})") from None
    if length is None:
        raise bad(f"{size} bytes, shorter than the 8-byte header length")
    if length > min(size - 8, MAX_HEADER_BYTES):
        raise bad(f"header length {length} does not fit in the file's {size} bytes")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise bad(f"header is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise bad("__metadata__ is not an object")
    for name, entry in header.items():
        problem = _check_tensor(name, entry)
        if problem:
            raise bad(problem)
    cursor = 0
    for name, entry in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        begin, end = entry["data_offsets"]
        if begin != cursor:
            raise bad(f"tensor {name!r}: data_offsets [{begin}, {end}] " + ("overlap another tensor" if begin < cursor
                      else f"leave a gap after byte {cursor}"))  # fmt: skip
        cursor = end
    if 8 + length + cursor != size:
        raise bad(f"the tensors end at byte {8 + length + cursor}, the file has {size} bytes")
    return SafetensorsHeader(path, length, header, metadata)
