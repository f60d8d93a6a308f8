"""What a running generate shard records about itself, so that `draftsmith status` never has to
parse every row: the progress record ``progress-s{i}of{N}.json`` and its row statistics.

The record is written atomically (a rename) every few seconds and at close. For each row part it
holds the byte offset the statistics cover (``bytes``) and what the rows up to there add up to, so a
reader takes the record and parses only the tail of each part past that offset (up to its last
newline: a half-written last line is not a row yet). A directory without a record (written before
it existed) is read in full. ``history`` holds ``[unix time, rows, output tokens]`` points of the
shard (all runs), thinned to at most `HISTORY_POINTS`, for rates over a recent window.

A failure's ``reason`` (the failures file) falls into one kind (`failure_kind`): ``timeout``,
``http_<status>``, ``connection``, ``cut_off`` (a reply that ended before its finish), ``incomplete``
(no complete answer) or ``other``.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsmith.core.readers import BadJSONError, read_json

PROGRESS_PREFIX = "progress-"
HISTORY_POINTS = 2000
_BUCKET_GROWTH = 1.02  # length histogram buckets 2% wide: a quantile read off it is within 1%


def progress_name(tag: str) -> str:
    return f"{PROGRESS_PREFIX}{tag}.json"


def length_bucket(tokens: int) -> int:
    """The histogram bucket of an output length (0 for an empty output)."""
    return 0 if tokens <= 0 else 1 + int(math.log(tokens) / math.log(_BUCKET_GROWTH))


def bucket_range(bucket: int) -> tuple[int, int]:
    """The whole token counts a bucket holds: (fewest, most)."""
    if bucket <= 0:
        return 0, 0
    fewest = math.ceil(_BUCKET_GROWTH ** (bucket - 1) - 1e-9)
    return fewest, max(fewest, math.ceil(_BUCKET_GROWTH**bucket - 1e-9) - 1)


def bucket_tokens(bucket: int) -> float:
    """The middle of the token counts a bucket holds."""
    return sum(bucket_range(bucket)) / 2


def histogram_quantile(histogram: dict[str, int] | Counter, share: float, cap: int | None = None) -> float | None:
    """The output length below which ``share`` of the rows fall, read off the histogram: the middle
    of its bucket's token counts, never above ``cap`` (the run's max tokens: a row stopped by the cap
    has exactly that many, and 2% buckets around it would otherwise read a few tokens past it)."""
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = share * total, 0
    for bucket in sorted(histogram, key=int):
        seen += histogram[bucket]
        if seen >= rank:
            middle = bucket_tokens(int(bucket))
            return round(min(middle, cap) if cap else middle, 1)
    return None


_HTTP = re.compile(r"HTTP (\d{3})")


def failure_kind(reason: str) -> str:
    text = reason or ""
    if match := _HTTP.search(text):
        return f"http_{match.group(1)}"
    lowered = text.lower()
    if "timed out" in lowered or "timeout" in lowered:
        return "timeout"
    if "not a complete answer" in lowered:
        return "incomplete"
    if "cut" in lowered or "before its finish" in lowered or "incomplete" in lowered:
        return "cut_off"
    if "connection" in lowered:
        return "connection"
    return "other"


class RowStats:
    """What a run of rows adds up to: counts, output tokens, finish reasons, a length histogram."""

    FIELDS = ("rows", "output_tokens", "reasoning_tokens", "length_finish")

    def __init__(self, data: dict[str, Any] | None = None):
        data = data or {}
        self.rows = int(data.get("rows", 0))
        self.output_tokens = int(data.get("output_tokens", 0))
        self.reasoning_tokens = int(data.get("reasoning_tokens", 0))
        self.length_finish = int(data.get("length_finish", 0))
        self.histogram: Counter[str] = Counter({str(k): int(v) for k, v in (data.get("histogram") or {}).items()})

    def add(self, row: dict[str, Any]) -> None:
        tokens = row.get("completion_tokens")
        if not isinstance(tokens, int):
            ids = row.get("completion_token_ids")
            tokens = len(ids) if isinstance(ids, list) else 0
        reasoning = row.get("reasoning_tokens")
        self.rows += 1
        self.output_tokens += tokens
        self.reasoning_tokens += reasoning if isinstance(reasoning, int) else 0
        self.length_finish += row.get("finish_reason") == "length"
        self.histogram[str(length_bucket(tokens))] += 1

    def merge(self, other: RowStats) -> RowStats:
        for name in self.FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.histogram.update(other.histogram)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {**{name: getattr(self, name) for name in self.FIELDS}, "histogram": dict(self.histogram)}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _optional(check):
    return lambda value: value is None or check(value)


# What each field a reader uses must hold (a record whose fields do not is not used: see `read_progress`).
_RECORD_FIELDS = {
    "started_at": (_optional(_time), "a unix time"), "first_started_at": (_optional(_time), "a unix time"),
    "last_row_at": (_optional(_time), "a unix time"), "updated_at": (_optional(_time), "a unix time"),
    "input": (_optional(_count), "a count"), "skipped_failed": (_optional(_count), "a count"),
    "already_done": (_optional(_count), "a count"), "todo": (_optional(_count), "a count"),
    "rows_at_start": (_count, "a count"), "output_tokens_at_start": (_count, "a count"),
    "failures_start": (_count, "a byte offset"),
    "history": (_optional(lambda v: isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 3 and _time(p[0]) and _count(p[1]) and _count(p[2]) for p in v)),
        "a list of [unix time, rows, output tokens] points"),
    "settings": (_optional(lambda v: isinstance(v, dict) and (
        v.get("endpoints") is None or (isinstance(v["endpoints"], list) and all(isinstance(u, str) for u in v["endpoints"])))),
        "an object (its endpoints a list of URLs)"),
    "parts": (_optional(lambda v: isinstance(v, dict)), "an object of row parts"),
}  # fmt: skip


def _part_problem(name: str, entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return f"parts.{name} is {type(entry).__name__}, expected an object"
    for field in ("bytes", *RowStats.FIELDS):
        if field in entry and not _count(entry[field]):
            return f"parts.{name}.{field} is {entry[field]!r:.60}, expected a count"
    histogram = entry.get("histogram")
    if histogram is not None and not (isinstance(histogram, dict) and all(
            key.isascii() and key.isdigit() and len(key) < 6 and _count(count) for key, count in histogram.items())):  # fmt: skip
        return f"parts.{name}.histogram is {histogram!r:.60}, expected an object of length bucket -> count"
    return None


def progress_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with a progress record's fields (None: every field a reader uses holds what it should)."""
    for field, (valid, expected) in _RECORD_FIELDS.items():
        if field in record and not valid(record[field]):
            return f"{field} is {record[field]!r:.60}, expected {expected}"
    for name, entry in (record.get("parts") or {}).items():
        if problem := _part_problem(name, entry):
            return problem
    return None


def _warn(message: str) -> None:
    print(f"draftsmith: warning: {message}", file=sys.stderr, flush=True)


def read_progress(path: Path, warn: Callable[[str], None] = _warn) -> dict[str, Any] | None:
    """A progress record, or None when there is none, or it is not one (another file's JSON, or a
    damaged record: said through ``warn`` in one line naming the file and field). The record only
    saves re-reading rows, so a reader without one reads the rows in full and loses nothing; a
    stage file that is not a regular file (a FIFO, a link to a device) is an `InputError`."""
    try:
        record = read_json(path, "progress record", missing_ok=True)
    except BadJSONError as error:
        warn(f"{error}: ignored, the rows are read in full")
        return None
    if not isinstance(record, dict) or record.get("kind") != "generate-progress":
        return None
    if problem := progress_problem(record):
        warn(f"{path}: a damaged progress record ({problem}): ignored, the rows are read in full")
        return None
    return record


def thin_history(history: list[list[float]]) -> list[list[float]]:
    """Keep at most `HISTORY_POINTS` points: drop every other one of the older half (recent points stay dense)."""
    if len(history) <= HISTORY_POINTS:
        return history
    half = len(history) // 2
    return history[:half:2] + history[half:]
