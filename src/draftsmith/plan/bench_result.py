"""Reading a saved `draftsmith bench` result (contract 3) as the plan's per-GPU throughput."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from draftsmith.core.errors import InputError
from draftsmith.core.io import read_json_file

BENCH_KIND = "draftsmith.bench"
BENCH_VERSION = 1


class BenchSummary(BaseModel):
    """What the plan needs from a bench result: one endpoint (= one GPU/server) at its knee."""

    path: str | None = None
    engine: str | None = None
    model: str | None = None
    endpoint: str | None = None
    max_tokens: int | None = None
    knee_concurrency: int
    knee_output_tokens_per_s: float  # per GPU, by contract
    knee_mean_output_tokens: float | None = None  # measured at the knee, when the result row is there


def check_result_header(data: Any, source: str, kind: str, version: int, what: str) -> None:
    """A measured-result file (bench, train benchmark) is a JSON object of a known kind and version."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a JSON object")
    if data.get("kind") != kind:
        raise InputError(f"{source}: field 'kind' is {data.get('kind')!r}, expected {kind!r}")
    if data.get("version") != version:
        raise InputError(f"{source}: unsupported {what} version {data.get('version')!r} (this reads {version})")


def positive_field(data: dict, key: str, source: str, integer: bool = False, label: str | None = None) -> Any:
    """`data[key]` when it is a positive finite number (a whole one if `integer`; never a bool)."""
    value = data.get(key)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
        kind = "integer" if integer else "number"
        raise InputError(f"{source}: {label or key} must be a positive {kind}, got {value!r}")
    return value


def load_bench(path: str | Path) -> BenchSummary:
    return bench_from_dict(read_json_file(Path(path), "bench result file"), source=str(path))


def bench_from_dict(data: Any, source: str = "bench result") -> BenchSummary:
    check_result_header(data, source, BENCH_KIND, BENCH_VERSION, "bench")
    knee = data.get("knee")
    if not isinstance(knee, dict):
        raise InputError(f"{source}: missing field 'knee'")
    rate = positive_field(knee, "output_tokens_per_s", source, label="knee.output_tokens_per_s")
    concurrency = positive_field(knee, "concurrency", source, integer=True, label="knee.concurrency")
    mean_output = None
    results = data.get("results")
    if isinstance(results, list):
        for row in results:
            if isinstance(row, dict) and row.get("concurrency") == concurrency:
                value = row.get("mean_output_tokens")
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                    mean_output = float(value)
    max_tokens = data.get("max_tokens")
    return BenchSummary(
        path=source,
        engine=data.get("engine") if isinstance(data.get("engine"), str) else None,
        model=data.get("model") if isinstance(data.get("model"), str) else None,
        endpoint=data.get("endpoint") if isinstance(data.get("endpoint"), str) else None,
        max_tokens=max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None,
        knee_concurrency=concurrency,
        knee_output_tokens_per_s=float(rate),
        knee_mean_output_tokens=mean_output,
    )
