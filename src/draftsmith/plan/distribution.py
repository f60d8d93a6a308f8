"""Observed length distributions: loading them from files and the long-tail statistics a plan needs.

A thinking model's output lengths are anything but normal: a few percent of samples run to the
`max_tokens` cap and dominate wall time. Lengths come from a pilot `generate` run (JSONL with
`completion_tokens`), a tokenized dataset (Parquet `num_tokens`), or a plain list of numbers.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from draftsmith.core.errors import InputError
from draftsmith.core.lines import decode_line, iter_lines

TAIL_FRACTION = 0.10
_PARQUET_SUFFIXES = {".parquet", ".pq"}
_JSONL_SUFFIXES = {".jsonl", ".ndjson", ".json"}
_ARROW_SUFFIXES = {".arrow", ".feather"}


# A share of answers at the cap above which measured lengths say little about the true ones.
CENSORED_SHARE = 0.05


class LengthStats(BaseModel):
    """Summary of a length distribution after the optional `max_tokens` cap."""

    source: str | None = None
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: int
    max_tokens: int | None = None
    share_at_cap: float | None = None  # share of samples that hit max_tokens (truncated)
    tokens_cut_share: float | None = None  # share of observed tokens removed by the cap
    mean_before_cap: float | None = None
    tail_fraction: float = TAIL_FRACTION
    tail_token_share: float  # share of all tokens, hence of decode time, in the longest tail_fraction

    def suggest_max_tokens(self) -> tuple[int, str]:
        """A --max-tokens for the real run from these measured output lengths, and why.

        Lengths measured under a cap that many answers hit are censored (their true length is
        unknown), so the suggestion then doubles the cap; otherwise it covers the 99th percentile
        with a quarter of headroom, rounded up to a multiple of 256."""
        if self.max_tokens is not None and (self.share_at_cap or 0) >= CENSORED_SHARE:
            suggested = 1 << (2 * self.max_tokens - 1).bit_length()
            return suggested, (f"{self.share_at_cap:.0%} of measured answers hit max_tokens={self.max_tokens:,}, so their "
                               f"lengths are unknown: measure again with --max-tokens {suggested:,}")
        suggested = max(256, math.ceil(self.p99 * 1.25 / 256) * 256)
        return suggested, f"covers the measured p99 ({self.p99:,.0f} tokens) with 25% headroom"

    def describe_tail(self) -> str:
        return (
            f"the longest {self.tail_fraction:.0%} of samples are {self.tail_token_share:.0%} "
            f"of the output tokens (and of the generation time at a steady throughput)"
        )


def summarize_lengths(
    lengths: Any, max_tokens: int | None = None, source: str | None = None, tail_fraction: float = TAIL_FRACTION
) -> LengthStats:
    """Statistics of `lengths` capped at `max_tokens`: percentiles, share truncated, tail cost."""
    values = np.asarray(list(lengths) if not isinstance(lengths, np.ndarray) else lengths, dtype=np.float64)
    where = f" in {source}" if source else ""
    if values.size == 0:
        raise InputError(f"length distribution{where} is empty")
    if not np.all(np.isfinite(values)):
        raise InputError(f"length distribution{where} contains a non-finite value")
    if np.any(values < 0):
        index = int(np.argmax(values < 0))
        raise InputError(f"length distribution{where}: value #{index + 1} is negative ({values[index]:g})")
    if max_tokens is not None and max_tokens <= 0:
        raise InputError(f"max_tokens must be positive, got {max_tokens}")
    mean_before = float(values.mean())
    share_at_cap = tokens_cut_share = None
    if max_tokens is not None:
        share_at_cap = float(np.mean(values >= max_tokens))
        capped = np.minimum(values, max_tokens)
        total_before = values.sum()
        tokens_cut_share = float(1 - capped.sum() / total_before) if total_before > 0 else 0.0
        values = capped
    total = values.sum()
    tail_count = max(1, math.ceil(tail_fraction * values.size))
    longest = np.sort(values)[::-1][:tail_count]
    tail_share = float(longest.sum() / total) if total > 0 else 0.0
    p50, p90, p99 = (float(v) for v in np.percentile(values, [50, 90, 99]))
    return LengthStats(
        source=source,
        count=int(values.size),
        mean=float(values.mean()),
        p50=p50,
        p90=p90,
        p99=p99,
        max=int(values.max()),
        max_tokens=max_tokens,
        share_at_cap=share_at_cap,
        tokens_cut_share=tokens_cut_share,
        mean_before_cap=mean_before if max_tokens is not None else None,
        tail_fraction=tail_fraction,
        tail_token_share=tail_share,
    )


def split_source_spec(spec: str | Path) -> tuple[Path, str | None]:
    """'data.parquet:completion_tokens' -> (path, column); a path that exists as written wins."""
    text = str(spec)
    if Path(text).exists() or ":" not in text:
        return Path(text), None
    path_text, column = text.rsplit(":", 1)
    if not column or "/" in column:
        return Path(text), None
    return Path(path_text), column


def load_lengths(spec: str | Path, default_column: str | None = None) -> np.ndarray:
    """Load lengths from `path[:column]`.

    JSONL/JSON rows (column may be dotted, e.g. `usage.completion_tokens`), a Parquet file or a
    directory of Parquet shards, an Arrow file, CSV (column by header name) or plain text with one
    number per line. A column holding lists (token ids) counts their lengths. Rows where the value
    is null are skipped (a pilot run may not report usage for every row); wrong types are errors.
    """
    path, column = split_source_spec(spec)
    column = column or default_column
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    suffix = path.suffix.lower()
    if path.is_dir() or suffix in _PARQUET_SUFFIXES or suffix in _ARROW_SUFFIXES:
        values = _load_table_column(path, column)
    elif suffix in _JSONL_SUFFIXES:
        values = _load_jsonl(path, column)
    elif suffix in {".csv", ".tsv"}:
        values = _load_csv(path, column, delimiter="\t" if suffix == ".tsv" else ",")
    else:
        if column is not None:
            raise InputError(f"{path}: a column ({column!r}) only applies to JSONL, CSV or Parquet files")
        values = _load_text(path)
    if not values:
        raise InputError(f"{path}: no lengths found" + (f" in column {column!r}" if column else ""))
    return np.asarray(values, dtype=np.float64)


def _as_length(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise InputError(f"{where}: expected a number or a list, got {value!r}")
    if isinstance(value, (list, tuple)):
        return float(len(value))
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise InputError(f"{where}: length must be a non-negative number, got {value!r}")
        return float(value)
    raise InputError(f"{where}: expected a number or a list, got {type(value).__name__} {value!r}")


def _load_jsonl(path: Path, column: str | None) -> list[float]:
    if column is None:
        raise InputError(f"{path}: name the field holding lengths, e.g. {path}:completion_tokens")
    keys = column.split(".")
    values: list[float] = []
    with path.open("rb") as handle:
        first = handle.read(1)
    if path.suffix.lower() == ".json" and first == b"[":
        try:
            rows = json.loads(decode_line(path.read_bytes(), str(path)))
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: invalid JSON ({error})") from None
        numbered: Any = enumerate(rows, start=1)
        label = "item"
    else:
        numbered = iter_lines(path)
        label = "line"
    for number, item in numbered:
        if isinstance(item, str):
            if not item.strip():
                continue
            try:
                item = json.loads(item)
            except json.JSONDecodeError as error:
                raise InputError(f"{path}:{number}: invalid JSON ({error.msg})") from None
        value: Any = item
        for key in keys:
            if not isinstance(value, dict):
                raise InputError(f"{path} {label} {number}: expected an object with field {column!r}")
            if key not in value:
                raise InputError(f"{path} {label} {number}: no field {column!r}")
            value = value[key]
        length = _as_length(value, f"{path} {label} {number} field {column!r}")
        if length is not None:
            values.append(length)
    return values


def _load_table_column(path: Path, column: str | None) -> list[float]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    try:
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.suffix.lower() in _PARQUET_SUFFIXES | _ARROW_SUFFIXES)
            if not files:
                raise InputError(f"{path}: directory has no Parquet or Arrow files")
            fmt = "parquet" if files[0].suffix.lower() in _PARQUET_SUFFIXES else "arrow"
            dataset = ds.dataset([str(f) for f in files], format="ipc" if fmt == "arrow" else fmt)
        else:
            fmt = "parquet" if path.suffix.lower() in _PARQUET_SUFFIXES else "ipc"
            dataset = ds.dataset(str(path), format=fmt)
    except (pa.ArrowInvalid, OSError) as error:
        raise InputError(f"{path}: cannot read as Parquet/Arrow ({error})") from None
    names = dataset.schema.names
    if column is None:
        guesses = [name for name in ("completion_tokens", "num_tokens", "output_tokens", "length") if name in names]
        if not guesses:
            raise InputError(f"{path}: name the column holding lengths (columns: {', '.join(names)})")
        column = guesses[0]
    if column not in names:
        raise InputError(f"{path}: no column {column!r} (columns: {', '.join(names)})")
    array = dataset.to_table(columns=[column]).column(column)
    kind = array.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        array = pc.list_value_length(array)
    elif not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise InputError(f"{path}: column {column!r} has type {kind}, expected numbers or lists")
    values = [float(v) for v in array.drop_null().to_pylist()]
    negatives = [v for v in values if v < 0 or not math.isfinite(v)]
    if negatives:
        raise InputError(f"{path}: column {column!r} has an invalid length {negatives[0]:g}")
    return values


def _load_csv(path: Path, column: str | None, delimiter: str) -> list[float]:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter=delimiter))
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if not rows:
        return []
    header_present = any(not _is_number(cell) for cell in rows[0])
    header = [cell.strip() for cell in rows[0]] if header_present else None
    body = rows[1:] if header_present else rows
    first_line = 2 if header_present else 1
    if column is not None:
        if header is None:
            raise InputError(f"{path}: has no header row, so column {column!r} cannot be found")
        if column not in header:
            raise InputError(f"{path}: no column {column!r} (columns: {', '.join(header)})")
        index = header.index(column)
    elif len(rows[0]) == 1:
        index = 0
    else:
        raise InputError(f"{path}: has {len(rows[0])} columns; name one, e.g. {path}:{(header or ['?'])[0]}")
    values: list[float] = []
    for offset, row in enumerate(body):
        line = first_line + offset
        if index >= len(row) or not row[index].strip():
            continue
        values.append(_parse_length_text(row[index], f"{path}:{line}"))
    return values


def _load_text(path: Path) -> list[float]:
    values: list[float] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.split("#", 1)[0].strip()
            if text:
                values.append(_parse_length_text(text, f"{path}:{number}"))
    return values


def _is_number(text: str) -> bool:
    try:
        float(text.strip())
        return True
    except ValueError:
        return False


def _parse_length_text(text: str, where: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise InputError(f"{where}: {text.strip()!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{where}: length must be a non-negative number, got {text.strip()!r}")
    return value
