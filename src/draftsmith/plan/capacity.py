"""The capacity plan: how long regenerating a dataset takes, what it costs in GPUs and disk.

`make_plan(PlanInputs(...)) -> Plan` is the whole computation; the CLI only gathers inputs and
renders the result. Time is output tokens over decode throughput: the engines' measured output
tok/s (and a bench knee) already include the prefill of the prompts that produced them.

GPU scaling: `n` data-parallel servers give `per_gpu * n * efficiency` tok/s for n >= 2 and
`per_gpu` for one, so "400 tok/s per GPU, 4 GPUs, 0.9" is 1,440 tok/s.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from draftsmith.core.config import validate_config
from draftsmith.core.errors import InputError
from draftsmith.plan.bench_result import BenchSummary, load_bench
from draftsmith.plan.distribution import LengthStats, summarize_lengths
from draftsmith.plan.rates import DEFAULT_RATE_TOLERANCE, RateCheck, RateSource, choose_rate
from draftsmith.model.storage import StorageEstimate, estimate_hidden_state_storage, read_model_shape
from draftsmith.core.units import (
    format_duration,
    parse_count,
    parse_duration,
    parse_rate,
    parse_size,
)

DEFAULT_CAPTURED_LAYERS = 5  # DFlash's default number of target feature layers (k=5)
DEFAULT_SENSITIVITY_FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
DEFAULT_GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)


class PlanInputs(BaseModel):
    """Everything a plan can be given. Strings with units are accepted where a person would write them."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    samples: int
    output_mean: float | None = None
    output_lengths: list[float] | None = None
    output_lengths_source: str | None = None
    prompt_mean: float | None = None
    prompt_lengths: list[float] | None = None
    prompt_lengths_source: str | None = None
    max_tokens: int | None = None
    per_gpu: str | None = None  # "400 tok/s" per GPU
    gpus: int | None = None
    efficiency: float = 1.0
    throughput: str | None = None  # total over all GPUs, "1,600 tok/s" or "5.76M/hour"
    bench: BenchSummary | None = None
    claimed_rates: list[str] = Field(default_factory=list)
    use_rate: str | None = None
    rate_tolerance: float = DEFAULT_RATE_TOLERANCE
    deadline: str | None = None  # "7d", "36h"
    hidden_size: int | None = None
    captured_layers: int = DEFAULT_CAPTURED_LAYERS
    dtype: str = "bfloat16"
    model_config_path: str | None = None
    disk: int | None = None  # bytes; "90TB" and "2 TiB" accepted
    sensitivity_factors: list[float] = Field(default_factory=lambda: list(DEFAULT_SENSITIVITY_FACTORS))
    gpu_counts: list[int] | None = None
    # With model_config_path: the decode ceiling of `plan engine` beside the days (plan.engine).
    gpu: str | None = None
    concurrency: str | None = None
    weights: str | None = None
    kv_cache: str | None = None
    engine: str | None = None

    @field_validator("gpu", "concurrency", "weights", "kv_cache", "engine", mode="before")
    @classmethod
    def _engine_text(cls, value: Any) -> Any:
        return None if value is None else str(value)

    @field_validator("samples", "max_tokens", "gpus", "hidden_size", "captured_layers", mode="before")
    @classmethod
    def _positive_count(cls, value: Any, info) -> Any:
        if value is None:
            return None
        number = parse_count(value, f"--{info.field_name.replace('_', '-')}")
        if number <= 0 or number != int(number):
            raise InputError(f"--{info.field_name.replace('_', '-')} must be a positive whole number, got {value!r}")
        return int(number)

    @field_validator("output_mean", "prompt_mean", mode="before")
    @classmethod
    def _length(cls, value: Any, info) -> Any:
        if value is None:
            return None
        number = parse_count(value, f"--{info.field_name.replace('_', '-')}")
        if info.field_name == "output_mean" and number <= 0:
            raise InputError(f"--output-mean must be greater than zero, got {value!r}")
        return number

    @field_validator("per_gpu", "throughput", mode="before")
    @classmethod
    def _rate(cls, value: Any, info) -> Any:
        if value is None:
            return None
        text = str(value)
        flag = f"--{info.field_name.replace('_', '-')}"
        rate = parse_rate(text, flag)
        if rate.tokens_per_s <= 0:
            raise InputError(f"{flag} {text!r} must be greater than zero")
        if rate.per_gpu and info.field_name == "throughput":
            raise InputError(f"--throughput {text!r} is per GPU; --throughput is the total, use --per-gpu for this")
        return text

    @field_validator("claimed_rates", mode="before")
    @classmethod
    def _claimed(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            value = [value]
        texts = [str(item) for item in value]
        for text in texts:
            if parse_rate(text, "--claimed-rate", bare_unit=None).tokens_per_s <= 0:
                raise InputError(f"--claimed-rate {text!r} must be greater than zero")
        return texts

    @field_validator("efficiency")
    @classmethod
    def _efficiency(cls, value: float) -> float:
        if not (0 < value <= 1):
            raise InputError(f"--efficiency must be in (0, 1], got {value!r}")
        return value

    @field_validator("rate_tolerance")
    @classmethod
    def _tolerance(cls, value: float) -> float:
        if not (0 < value < 1):
            raise InputError(f"--rate-tolerance must be in (0, 1), got {value!r}")
        return value

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> Any:
        if value is None:
            return None
        parse_duration(value, "--deadline")
        return str(value)

    @field_validator("disk", mode="before")
    @classmethod
    def _disk(cls, value: Any) -> Any:
        if value is None:
            return None
        size = parse_size(value, "--disk")
        if size <= 0:
            raise InputError(f"--disk must be greater than zero, got {value!r}")
        return size

    @field_validator("bench", mode="before")
    @classmethod
    def _bench(cls, value: Any) -> Any:
        if isinstance(value, (str, Path)):
            return load_bench(value)
        return value

    @field_validator("sensitivity_factors")
    @classmethod
    def _factors(cls, value: list[float]) -> list[float]:
        if not value or any(not math.isfinite(f) or f <= 0 for f in value):
            raise InputError("sensitivity factors must be positive numbers")
        return sorted(set(value))

    @field_validator("gpu_counts")
    @classmethod
    def _gpu_counts(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(n <= 0 for n in value)):
            raise InputError("--gpu-counts must be positive whole numbers")
        return value


def validate_inputs(data: dict[str, Any] | PlanInputs) -> PlanInputs:
    """PlanInputs from a dict, with pydantic's errors turned into one `InputError` line."""
    return data if isinstance(data, PlanInputs) else validate_config(PlanInputs, data)


class Throughput(BaseModel):
    tokens_per_s: float
    source: str  # the RateSource name the plan runs on
    origin: str
    per_gpu_tokens_per_s: float | None
    gpus: int | None
    efficiency: float
    tokens_per_hour: float
    tokens_per_day: float


class WallTime(BaseModel):
    seconds: float
    hours: float
    days: float
    human: str

    @classmethod
    def from_seconds(cls, seconds: float) -> "WallTime":
        return cls(seconds=seconds, hours=seconds / 3600, days=seconds / 86400, human=format_duration(seconds))


class SensitivityTable(BaseModel):
    """Days to finish: rows are throughputs, columns average output lengths."""

    throughput_factors: list[float]
    tokens_per_s: list[float]
    length_factors: list[float]
    output_means: list[float]
    days: list[list[float]]


class GpuScalingRow(BaseModel):
    gpus: int
    tokens_per_s: float
    days: float
    hours: float
    meets_deadline: bool | None = None


class DeadlinePlan(BaseModel):
    deadline: str
    deadline_s: float
    required_tokens_per_s: float
    meets_deadline: bool
    slack_s: float  # deadline minus planned wall time; negative when late
    gpus_needed: int | None  # None when no per-GPU throughput is known
    wall_time_with_gpus_needed: WallTime | None = None


class Plan(BaseModel):
    inputs: dict[str, Any]  # the validated inputs, without the raw length lists
    samples: int
    output_mean: float
    prompt_mean: float | None
    max_tokens: int | None
    total_output_tokens: int
    total_prompt_tokens: int | None
    throughput: Throughput
    wall_time: WallTime
    rate_checks: list[RateCheck]
    output_distribution: LengthStats | None = None
    prompt_distribution: LengthStats | None = None
    sensitivity: SensitivityTable
    gpu_scaling: list[GpuScalingRow]
    deadline: DeadlinePlan | None = None
    storage: StorageEstimate | None = None
    ceiling: dict[str, Any] | None = None  # `plan engine`'s ceiling, days and measured share (with --gpu and --model-config)
    suggested_max_tokens: int | None = None  # from measured output lengths (--output-lengths)
    suggested_max_tokens_reason: str | None = None
    warnings: list[str] = Field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "draftsmith.plan", "version": 1, **self.model_dump(mode="json")}


def cluster_tokens_per_s(per_gpu: float, gpus: int, efficiency: float) -> float:
    return per_gpu * gpus * (efficiency if gpus > 1 else 1.0)


def gpus_needed(required_tokens_per_s: float, per_gpu: float, efficiency: float) -> int:
    """Fewest GPUs whose cluster throughput reaches `required_tokens_per_s`."""
    if per_gpu >= required_tokens_per_s:
        return 1
    count = max(2, math.ceil(required_tokens_per_s / (per_gpu * efficiency) - 1e-9))
    while cluster_tokens_per_s(per_gpu, count, efficiency) < required_tokens_per_s * (1 - 1e-12):
        count += 1
    return count


def _rate_sources(inputs: PlanInputs) -> list[RateSource]:
    """Every throughput figure, in the order of trust: measured, per-GPU, total, quoted."""
    sources: list[RateSource] = []
    gpus = inputs.gpus or 1
    scale = cluster_tokens_per_s(1.0, gpus, inputs.efficiency)
    if inputs.bench is not None:
        knee = inputs.bench.knee_output_tokens_per_s
        # A measurement has no written unit to mistype, so it carries no amount/unit to re-read.
        sources.append(
            RateSource(
                name="bench",
                origin=f"bench knee ({inputs.bench.path or 'bench'}, {knee:,.0f} tok/s per GPU x {gpus})",
                text=f"{knee:g} tok/s",
                tokens_per_s=knee * scale,
                scale=scale,
            )
        )
    if inputs.per_gpu is not None:
        rate = parse_rate(inputs.per_gpu, "--per-gpu")
        sources.append(RateSource.from_rate("per-gpu", f"--per-gpu x {gpus} GPUs", rate, scale))
    if inputs.throughput is not None:
        sources.append(RateSource.from_rate("throughput", "--throughput", parse_rate(inputs.throughput, "--throughput")))
    for index, text in enumerate(inputs.claimed_rates):
        name = "claimed" if index == 0 else f"claimed-{index + 1}"
        rate = parse_rate(text, "--claimed-rate", bare_unit=None)
        if rate.per_gpu:
            sources.append(RateSource.from_rate(name, f"--claimed-rate x {gpus} GPUs", rate, scale))
        else:
            sources.append(RateSource.from_rate(name, "--claimed-rate", rate))
    return sources


def _resolve_lengths(
    mean: float | None, lengths: list[float] | None, source: str | None, max_tokens: int | None, flag: str
) -> tuple[float | None, LengthStats | None]:
    if mean is not None and lengths is not None:
        raise InputError(f"give either --{flag}-mean or --{flag}-lengths, not both")
    if lengths is not None:
        stats = summarize_lengths(lengths, max_tokens=max_tokens, source=source)
        return stats.mean, stats
    if mean is not None and max_tokens is not None and flag == "output" and mean > max_tokens:
        raise InputError(f"--output-mean {mean:g} is above --max-tokens {max_tokens}: an average cannot exceed the cap")
    return mean, None


def make_plan(inputs: PlanInputs | dict[str, Any]) -> Plan:
    """Compute the capacity plan. Raises `InputError` on bad input or unreconciled rates."""
    inputs = validate_inputs(inputs)
    warnings: list[str] = []

    output_mean, output_stats = _resolve_lengths(
        inputs.output_mean, inputs.output_lengths, inputs.output_lengths_source, inputs.max_tokens, "output"
    )
    if output_mean is None:
        raise InputError("missing output length: pass --output-mean (average tokens) or --output-lengths FILE[:COLUMN]")
    if output_mean <= 0:
        raise InputError("the output length distribution has a zero mean; nothing to generate")
    # Prompts are not capped by max_tokens (that limits completions only).
    prompt_mean, prompt_stats = _resolve_lengths(
        inputs.prompt_mean, inputs.prompt_lengths, inputs.prompt_lengths_source, None, "prompt"
    )
    throughput, checks = _throughput(inputs, warnings)
    total_output_tokens = round(inputs.samples * output_mean)
    total_prompt_tokens = round(inputs.samples * prompt_mean) if prompt_mean is not None else None
    seconds = total_output_tokens / throughput.tokens_per_s
    warnings += _length_warnings(inputs, output_mean, output_stats)
    deadline = _deadline(inputs, total_output_tokens, seconds, throughput.per_gpu_tokens_per_s, warnings)
    needed = deadline.gpus_needed if deadline else None
    ceiling = _ceiling(inputs, output_mean, prompt_mean, throughput, warnings)
    suggested, why = output_stats.suggest_max_tokens() if output_stats is not None else (None, None)
    return Plan(
        inputs=inputs.model_dump(mode="json", exclude={"output_lengths", "prompt_lengths"}),
        samples=inputs.samples,
        output_mean=output_mean,
        prompt_mean=prompt_mean,
        max_tokens=inputs.max_tokens,
        total_output_tokens=total_output_tokens,
        total_prompt_tokens=total_prompt_tokens,
        throughput=throughput,
        wall_time=WallTime.from_seconds(seconds),
        rate_checks=checks,
        output_distribution=output_stats,
        prompt_distribution=prompt_stats,
        sensitivity=_sensitivity(inputs, output_mean, throughput.tokens_per_s),
        gpu_scaling=_gpu_scaling(inputs, total_output_tokens, throughput, needed, deadline),
        deadline=deadline,
        storage=_storage(inputs, total_output_tokens, total_prompt_tokens, warnings),
        ceiling=ceiling,
        suggested_max_tokens=suggested,
        suggested_max_tokens_reason=why,
        warnings=warnings,
    )


def _ceiling(inputs: PlanInputs, output_mean: float, prompt_mean: float | None, throughput: Throughput,
             warnings: list[str]) -> dict[str, Any] | None:
    """`plan engine` on this plan's model, GPUs and lengths: the ceiling beside the days, the share the rate
    planned on is of it, and (with a bench) how this job's lengths change the batch that fits."""
    if inputs.gpu is None:
        return None
    if inputs.model_config_path is None:
        raise InputError("--gpu needs --model-config: the ceiling is computed from the model's config.json")
    from draftsmith.plan.engine import engine_settings, make_engine_plan

    measured: dict[str, Any] = {}
    if throughput.source == "bench" and inputs.bench is not None and inputs.bench.path:
        measured["bench"] = inputs.bench.path
    elif throughput.per_gpu_tokens_per_s is not None:
        measured["per_gpu"] = f"{throughput.per_gpu_tokens_per_s:.6g} tok/s"
    lengths = ({"output_lengths": inputs.output_lengths_source} if inputs.output_lengths_source
               else {"output_mean": f"{output_mean:.10g}"})
    config = engine_settings(
        model_config_path=inputs.model_config_path, gpu=inputs.gpu, gpus=str(throughput.gpus or inputs.gpus or 1),
        concurrency=inputs.concurrency, weights=inputs.weights, kv_cache=inputs.kv_cache, engine=inputs.engine,
        prompt_mean=f"{prompt_mean:.10g}" if prompt_mean is not None else None, samples=str(inputs.samples),
        max_tokens=str(inputs.max_tokens) if inputs.max_tokens else None, **lengths, **measured)
    engine_plan = make_engine_plan(config)
    warnings += [warning for warning in engine_plan.warnings if not warning.startswith("no --prompt-mean")]
    fields = ("gpu", "gpus", "engine", "weights", "batch", "max_batch", "mean_context", "ceiling_tokens_per_s_per_gpu",
              "efficiency", "days_at_ceiling", "days_at_efficiency", "measured_tokens_per_s_per_gpu", "measured_share",
              "bench_context", "prefill_share")
    return {field: getattr(engine_plan, field) for field in fields}


def _throughput(inputs: PlanInputs, warnings: list[str]) -> tuple[Throughput, list[RateCheck]]:
    """The rate the plan runs on (cross-checked against every other figure given) and its per-GPU share."""
    chosen, checks = choose_rate(_rate_sources(inputs), inputs.use_rate, inputs.rate_tolerance)
    for check in checks:
        if not check.agrees:
            warnings.append(f"planning on {chosen.name} as asked (--use-rate); {check.message}")
    gpus = inputs.gpus
    if chosen.name in ("bench", "per-gpu"):
        gpus = gpus or 1
    per_gpu = chosen.tokens_per_s / cluster_tokens_per_s(1.0, gpus, inputs.efficiency) if gpus is not None else None
    throughput = Throughput(
        tokens_per_s=chosen.tokens_per_s,
        source=chosen.name,
        origin=chosen.origin,
        per_gpu_tokens_per_s=per_gpu,
        gpus=gpus,
        efficiency=inputs.efficiency,
        tokens_per_hour=chosen.tokens_per_s * 3600,
        tokens_per_day=chosen.tokens_per_s * 86400,
    )
    return throughput, checks


def _length_warnings(inputs: PlanInputs, output_mean: float, output_stats: LengthStats | None) -> list[str]:
    warnings = []
    if inputs.bench is not None and inputs.bench.knee_mean_output_tokens:
        measured = inputs.bench.knee_mean_output_tokens
        if not (0.5 <= output_mean / measured <= 2):
            warnings.append(
                f"the bench knee was measured at {measured:,.0f} output tokens per request but the plan averages "
                f"{output_mean:,.0f}; throughput at that length may differ, re-run bench with a matching max_tokens"
                + ("" if inputs.gpu else " (--model-config with --gpu shows how the batch that fits and the ceiling change)")
            )
    if output_stats is not None and output_stats.share_at_cap is not None and output_stats.share_at_cap >= 0.05:
        warnings.append(
            f"{output_stats.share_at_cap:.0%} of samples hit max_tokens={inputs.max_tokens}: those completions are "
            f"cut off unfinished; consider a larger cap"
        )
    return warnings


def _sensitivity(inputs: PlanInputs, output_mean: float, tokens_per_s: float) -> SensitivityTable:
    factors = list(inputs.sensitivity_factors)
    # Longer outputs stop at max_tokens: columns the cap makes equal are one column (the plan's own kept).
    columns: dict[float, float] = {}
    for factor in sorted(factors, key=lambda f: f != 1.0):
        mean = min(output_mean * factor, inputs.max_tokens) if inputs.max_tokens else output_mean * factor
        if mean not in columns.values():
            columns[factor] = mean
    length_factors = [factor for factor in factors if factor in columns]
    output_means = [columns[factor] for factor in length_factors]
    rates = [tokens_per_s * f for f in factors]
    return SensitivityTable(
        throughput_factors=factors,
        tokens_per_s=rates,
        length_factors=length_factors,
        output_means=output_means,
        days=[[inputs.samples * mean / rate / 86400 for mean in output_means] for rate in rates],
    )


def _deadline(
    inputs: PlanInputs, total_output_tokens: int, seconds: float, per_gpu: float | None, warnings: list[str]
) -> DeadlinePlan | None:
    if inputs.deadline is None:
        return None
    deadline_s = parse_duration(inputs.deadline, "--deadline")
    required = total_output_tokens / deadline_s
    needed = with_needed = None
    if per_gpu is not None:
        needed = gpus_needed(required, per_gpu, inputs.efficiency)
        with_needed = WallTime.from_seconds(total_output_tokens / cluster_tokens_per_s(per_gpu, needed, inputs.efficiency))
    else:
        warnings.append("no GPU count or per-GPU rate given, so the GPUs needed for the deadline are unknown")
    return DeadlinePlan(
        deadline=inputs.deadline,
        deadline_s=deadline_s,
        required_tokens_per_s=required,
        meets_deadline=seconds <= deadline_s,
        slack_s=deadline_s - seconds,
        gpus_needed=needed,
        wall_time_with_gpus_needed=with_needed,
    )


def _gpu_scaling(
    inputs: PlanInputs, total_output_tokens: int, throughput: Throughput, needed: int | None,
    deadline: DeadlinePlan | None,
) -> list[GpuScalingRow]:
    per_gpu = throughput.per_gpu_tokens_per_s
    if per_gpu is None:
        return []
    counts = set(inputs.gpu_counts or DEFAULT_GPU_COUNTS)
    counts.update(n for n in (throughput.gpus, needed) if n)
    rows = []
    for count in sorted(counts):
        rate = cluster_tokens_per_s(per_gpu, count, inputs.efficiency)
        row_seconds = total_output_tokens / rate
        rows.append(
            GpuScalingRow(
                gpus=count,
                tokens_per_s=rate,
                days=row_seconds / 86400,
                hours=row_seconds / 3600,
                meets_deadline=(row_seconds <= deadline.deadline_s) if deadline else None,
            )
        )
    return rows


def _storage(
    inputs: PlanInputs, total_output_tokens: int, total_prompt_tokens: int | None, warnings: list[str]
) -> StorageEstimate | None:
    hidden_size = inputs.hidden_size
    if inputs.model_config_path is not None:
        config_hidden, config_layers = read_model_shape(inputs.model_config_path)
        if hidden_size is not None and hidden_size != config_hidden:
            warnings.append(f"--hidden-size {hidden_size} overrides hidden_size {config_hidden} from the model config")
        hidden_size = hidden_size or config_hidden
        if inputs.captured_layers > config_layers:
            raise InputError(
                f"--captured-layers {inputs.captured_layers} is more than the model's {config_layers} layers "
                f"({inputs.model_config_path})"
            )
    if hidden_size is None:
        return None
    if total_prompt_tokens is None:
        warnings.append("no prompt length given: hidden-state storage counts completion tokens only (an underestimate)")
    total_tokens = total_output_tokens + (total_prompt_tokens or 0)
    return estimate_hidden_state_storage(
        hidden_size=hidden_size,
        num_captured_layers=inputs.captured_layers,
        total_tokens=total_tokens,
        num_samples=inputs.samples,
        dtype=inputs.dtype,
        disk_bytes=inputs.disk,
    )

