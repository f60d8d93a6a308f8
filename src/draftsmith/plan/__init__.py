"""Capacity planning for regenerating a drafter's training data: time, GPUs, rates and disk.

    from draftsmith.plan import PlanInputs, make_plan
    plan = make_plan(PlanInputs(samples=914_000, output_mean=2500, throughput="1,600 tok/s"))
    plan.wall_time.days  # 16.5
"""

from draftsmith.plan.bench_result import BenchSummary, load_bench
from draftsmith.plan.capacity import (
    DeadlinePlan,
    GpuScalingRow,
    Plan,
    PlanInputs,
    SensitivityTable,
    Throughput,
    WallTime,
    cluster_tokens_per_s,
    gpus_needed,
    make_plan,
)
from draftsmith.plan.config import build_inputs, load_config_file
from draftsmith.plan.distribution import LengthStats, load_lengths, summarize_lengths
from draftsmith.plan.rates import RateCheck, RateMismatchError, RateSource, choose_rate, compare
from draftsmith.model.storage import StorageEstimate, estimate_hidden_state_storage, read_model_shape
from draftsmith.core.units import Rate, parse_count, parse_duration, parse_rate, parse_size

__all__ = [
    "BenchSummary",
    "DeadlinePlan",
    "GpuScalingRow",
    "LengthStats",
    "Plan",
    "PlanInputs",
    "Rate",
    "RateCheck",
    "RateMismatchError",
    "RateSource",
    "SensitivityTable",
    "StorageEstimate",
    "Throughput",
    "WallTime",
    "build_inputs",
    "choose_rate",
    "cluster_tokens_per_s",
    "compare",
    "estimate_hidden_state_storage",
    "gpus_needed",
    "load_bench",
    "load_config_file",
    "load_lengths",
    "make_plan",
    "parse_count",
    "parse_duration",
    "parse_rate",
    "parse_size",
    "read_model_shape",
    "summarize_lengths",
]
