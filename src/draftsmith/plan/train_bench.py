"""Reading `train_benchmark.json` (written by `draftsmith train --benchmark-steps N`) as a measured rate.

The file is the contract between the two stages; plan reads it by its fields and never imports the
trainer. `tokens_per_s` counts every context token of every sequence processed by all ranks, so the
per-GPU rate is `tokens_per_s / world_size`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from draftsmith.core.errors import InputError
from draftsmith.core.io import read_json_file
from draftsmith.plan.bench_result import check_result_header, positive_field

TRAIN_BENCH_KIND = "draftsmith.train_benchmark"
TRAIN_BENCH_VERSION = 1


class TrainBenchSummary(BaseModel):
    path: str | None = None
    mode: str  # "online" or "offline"
    device: str | None = None
    world_size: int
    steps: int
    tokens_per_s: float  # all ranks together
    samples_per_s: float
    mean_tokens_per_sample: float
    peak_memory_bytes: int | None = None
    shapes: dict[str, Any] = {}

    @property
    def per_gpu_tokens_per_s(self) -> float:
        return self.tokens_per_s / self.world_size


def load_train_bench(path: str | Path) -> TrainBenchSummary:
    return train_bench_from_dict(read_json_file(Path(path), "train benchmark file"), source=str(path))


def train_bench_from_dict(data: Any, source: str = "train benchmark") -> TrainBenchSummary:
    check_result_header(data, source, TRAIN_BENCH_KIND, TRAIN_BENCH_VERSION, "train benchmark")
    mode = data.get("mode")
    if mode not in ("online", "offline"):
        raise InputError(f"{source}: mode must be 'online' or 'offline', got {mode!r}")
    peak = data.get("peak_memory_bytes")
    return TrainBenchSummary(
        path=source,
        mode=mode,
        device=data.get("device") if isinstance(data.get("device"), str) else None,
        world_size=positive_field(data, "world_size", source, integer=True),
        steps=positive_field(data, "steps", source, integer=True),
        tokens_per_s=float(positive_field(data, "tokens_per_s", source)),
        samples_per_s=float(positive_field(data, "samples_per_s", source)),
        mean_tokens_per_sample=float(positive_field(data, "mean_tokens_per_sample", source)),
        peak_memory_bytes=peak if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0 else None,
        shapes=data["shapes"] if isinstance(data.get("shapes"), dict) else {},
    )
