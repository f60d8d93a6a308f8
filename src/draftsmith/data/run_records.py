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

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

PROGRESS_PREFIX = "progress-"
HISTORY_POINTS = 2000
_BUCKET_GROWTH = 1.02  # length histogram buckets 2% wide: a quantile read off it is within 1%


def progress_name(tag: str) -> str:
    return f"{PROGRESS_PREFIX}{tag}.json"


def length_bucket(tokens: int) -> int:
    """The histogram bucket of an output length (0 for an empty output)."""
    return 0 if tokens <= 0 else 1 + int(math.log(tokens) / math.log(_BUCKET_GROWTH))


def bucket_tokens(bucket: int) -> float:
    """The middle of a bucket, in tokens."""
    if bucket <= 0:
        return 0.0
    return _BUCKET_GROWTH ** (bucket - 1) * (1 + _BUCKET_GROWTH) / 2


def histogram_quantile(histogram: dict[str, int] | Counter, share: float) -> float | None:
    total = sum(histogram.values())
    if not total:
        return None
    rank, seen = share * total, 0
    for bucket in sorted(histogram, key=int):
        seen += histogram[bucket]
        if seen >= rank:
            return round(bucket_tokens(int(bucket)), 1)
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


def read_progress(path: Path) -> dict[str, Any] | None:
    """A progress record, or None when there is none (or it is not one: the reader then falls back)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("kind") == "generate-progress" else None


def thin_history(history: list[list[float]]) -> list[list[float]]:
    """Keep at most `HISTORY_POINTS` points: drop every other one of the older half (recent points stay dense)."""
    if len(history) <= HISTORY_POINTS:
        return history
    half = len(history) // 2
    return history[:half:2] + history[half:]
