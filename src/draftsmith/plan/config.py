"""Plan inputs from a YAML/TOML file and/or command-line flags (flags win).

Keys in a file are spelled like the flags, with hyphens or underscores:

    samples: 914000
    output-mean: 2500          # or output-lengths: pilot.jsonl:completion_tokens
    per-gpu: 400 tok/s
    gpus: 4
    claimed-rate: 5.4M/day
    deadline: 7d
    model-config: /models/target/config.json
    disk: 90TB

Relative paths in a file are relative to the file, so a plan file can live next to its data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import cli, read_config_file
from draftsmith.core.errors import InputError
from draftsmith.plan.bench_result import load_bench
from draftsmith.plan.capacity import PlanInputs, validate_inputs
from draftsmith.plan.distribution import load_lengths, split_source_spec
from draftsmith.core.units import parse_count

# File/flag key -> PlanInputs field. File-only conveniences (lists of factors) live here too.
KEY_TO_FIELD: dict[str, str] = {
    "samples": "samples",
    "num-samples": "samples",
    "output-mean": "output_mean",
    "output-lengths": "output_lengths",
    "prompt-mean": "prompt_mean",
    "prompt-lengths": "prompt_lengths",
    "max-tokens": "max_tokens",
    "per-gpu": "per_gpu",
    "gpus": "gpus",
    "efficiency": "efficiency",
    "throughput": "throughput",
    "bench": "bench",
    "claimed-rate": "claimed_rates",
    "claimed-rates": "claimed_rates",
    "use-rate": "use_rate",
    "rate-tolerance": "rate_tolerance",
    "deadline": "deadline",
    "hidden-size": "hidden_size",
    "captured-layers": "captured_layers",
    "dtype": "dtype",
    "model-config": "model_config_path",
    "disk": "disk",
    "sensitivity-factors": "sensitivity_factors",
    "gpu-counts": "gpu_counts",
}
_PATH_FIELDS = {"output_lengths", "prompt_lengths", "bench", "model_config_path", "train_bench"}

# `plan --train`: file/flag key -> TrainPlanInputs field. output-mean and prompt-mean add up to the
# mean length when mean-length is not given, so one plan file can serve both plans.
TRAIN_KEY_TO_FIELD: dict[str, str] = {
    "samples": "samples",
    "num-samples": "samples",
    "mean-length": "mean_length",
    "output-mean": "output_mean",
    "prompt-mean": "prompt_mean",
    "max-length": "max_length",
    "epochs": "epochs",
    "num-anchors": "num_anchors",
    "block-size": "block_size",
    "draft-layers": "draft_layers",
    "captured-layers": "num_features",
    "num-features": "num_features",
    "batch-size": "batch_size",
    "gpus": "gpus",
    "gpu": "gpu",
    "gpu-flops": "gpu_flops",
    "gpu-memory": "gpu_memory",
    "mfu": "mfu",
    "offline": "offline",
    "attention": "attention",
    "dtype": "dtype",
    "model-config": "model_config_path",
    "train-bench": "train_bench",
}


class PlanFlags(BaseModel):
    """The command line of `draftsmith plan`: raw text as a person writes it ("914k", "400 tok/s");
    `build_inputs` merges it over a plan file and `PlanInputs` parses and checks it."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    samples: Annotated[str | None, cli(metavar="N")] = Field(None, description="number of samples to generate (914000, 914k)")
    output_mean: Annotated[str | None, cli(metavar="TOKENS")] = Field(None, description="average output tokens per sample")
    output_lengths: Annotated[str | None, cli(metavar="FILE[:COLUMN]")] = Field(
        None, description="observed output lengths: FILE[:COLUMN] (JSONL, Parquet, CSV, text)"
    )
    prompt_mean: Annotated[str | None, cli(metavar="TOKENS")] = Field(None, description="average prompt tokens per sample")
    prompt_lengths: Annotated[str | None, cli(metavar="FILE[:COLUMN]")] = Field(
        None, description="observed prompt lengths: FILE[:COLUMN]"
    )
    max_tokens: Annotated[str | None, cli(metavar="TOKENS")] = Field(
        None, description="cap on output tokens; truncates the distribution"
    )
    per_gpu: Annotated[str | None, cli(metavar="RATE")] = Field(None, description="throughput of one GPU/server ('400 tok/s')")
    gpus: Annotated[str | None, cli(metavar="N")] = Field(None, description="number of GPUs/servers")
    efficiency: Annotated[float | None, cli(metavar="FRACTION")] = Field(
        None, description="scaling efficiency beyond one GPU (0-1]"
    )
    throughput: Annotated[str | None, cli(metavar="RATE")] = Field(
        None, description="total throughput ('1,600 tok/s', '5.76M/hour')"
    )
    bench: Annotated[str | None, cli(metavar="FILE")] = Field(
        None, description="saved `draftsmith bench` JSON; its knee is per GPU"
    )
    claimed_rates: Annotated[list[str], cli("--claimed-rate", split=False, metavar="RATE")] = Field(
        default_factory=list, description="a rate quoted elsewhere ('5.4M/day'), cross-checked; repeatable"
    )
    use_rate: Annotated[str | None, cli(metavar="NAME")] = Field(
        None, description="when rates disagree, the one to plan on: bench, per-gpu, throughput, claimed"
    )
    rate_tolerance: Annotated[float | None, cli(metavar="FRACTION")] = Field(
        None, description="relative gap two rates may have (0.1)"
    )
    deadline: Annotated[str | None, cli(metavar="DURATION")] = Field(
        None, description="finish within this time ('7d', '36h'): GPUs needed"
    )
    model_config_path: Annotated[str | None, cli("--model-config", metavar="PATH")] = Field(
        None, description="target's config.json (or model dir)"
    )
    hidden_size: Annotated[str | None, cli(metavar="N")] = Field(None, description="target hidden size (instead of --model-config)")
    captured_layers: Annotated[str | None, cli(metavar="N")] = Field(None, description="target layers captured (DFlash: 5)")
    dtype: Annotated[str | None, cli(metavar="DTYPE")] = Field(None, description="hidden-state dtype on disk (bfloat16)")
    disk: Annotated[str | None, cli(metavar="SIZE")] = Field(
        None, description="disk budget for offline hidden states ('90TB', '2 TiB')"
    )
    # `plan --train`: a drafter training run instead (wall time online/offline, GPU memory).
    train: bool = Field(False, description="plan a drafter training run instead: wall time and GPU memory")
    mean_length: Annotated[str | None, cli(metavar="TOKENS")] = Field(
        None, description="--train: mean tokens per sample (prompt + completion)"
    )
    max_length: Annotated[str | None, cli(metavar="TOKENS")] = Field(
        None, description="--train: longest sequence; memory is planned for it (3072)"
    )
    epochs: Annotated[str | None, cli(metavar="N")] = Field(None, description="--train: passes over the data (6)")
    num_anchors: Annotated[str | None, cli(metavar="N")] = Field(None, description="--train: blocks per sequence (512)")
    block_size: Annotated[str | None, cli(metavar="B")] = Field(None, description="--train: block size (16)")
    draft_layers: Annotated[str | None, cli(metavar="N")] = Field(None, description="--train: drafter layers (5)")
    batch_size: Annotated[str | None, cli(metavar="N")] = Field(
        None, description="--train: sequences per micro-batch per GPU (1)"
    )
    gpu: Annotated[str | None, cli(metavar="TYPE")] = Field(
        None, description="--train: GPU type for peak FLOP/s and memory: H100, H200, B200, A100, L40S"
    )
    gpu_flops: Annotated[str | None, cli(metavar="FLOPS")] = Field(None, description="--train: peak bf16 FLOP/s per GPU ('989T')")
    gpu_memory: Annotated[str | None, cli(metavar="SIZE")] = Field(None, description="--train: memory per GPU ('80GB')")
    mfu: Annotated[float | None, cli(metavar="FRACTION")] = Field(None, description="--train: model FLOP utilization (0.35)")
    offline: Annotated[bool | None, cli("--offline/--online")] = Field(
        None, description="--train: from stored features or with the target in the loop"
    )
    attention: Annotated[str | None, cli(metavar="KIND")] = Field(
        None, description="--train: drafter attention for the headline: sparse or dense"
    )
    train_bench: Annotated[str | None, cli(metavar="FILE")] = Field(
        None, description="--train: `train --benchmark-steps` JSON; its measured rate"
    )

    TRAIN_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"train", "mean_length", "max_length", "epochs", "num_anchors", "block_size", "draft_layers", "batch_size",
         "gpu", "gpu_flops", "gpu_memory", "mfu", "offline", "attention", "train_bench"}
    )

    def plan_overrides(self) -> dict[str, Any]:
        return self.model_dump(exclude=set(self.TRAIN_ONLY))

    def train_overrides(self) -> dict[str, Any]:
        """The --train flags, keyed by TrainPlanInputs field (--captured-layers is its num_features)."""
        keys = set(self.TRAIN_ONLY - {"train"}) | {
            "samples", "output_mean", "prompt_mean", "gpus", "dtype", "model_config_path"
        }
        values = self.model_dump(include=keys)
        values["num_features"] = self.captured_layers
        return values


def load_config_file(path: str | Path, key_to_field: dict[str, str] | None = None) -> dict[str, Any]:
    """Raw values from a YAML or TOML plan file, keyed by PlanInputs field, paths made absolute."""
    key_to_field = KEY_TO_FIELD if key_to_field is None else key_to_field
    path = Path(path)
    data = read_config_file(path)
    if isinstance(data.get("plan"), dict) and len(data) == 1:
        data = data["plan"]  # allow a [plan] table / plan: section
    values: dict[str, Any] = {}
    for key, value in data.items():
        field = key_to_field.get(str(key).replace("_", "-"))
        if field is None:
            known = ", ".join(sorted(k for k in key_to_field))
            raise InputError(f"{path}: unknown key {key!r} (known keys: {known})")
        if field in _PATH_FIELDS and isinstance(value, str):
            value = _relative_to(value, path.parent)
        values[field] = value
    return values


def _relative_to(spec: str, base: Path) -> str:
    file_path, column = split_source_spec(spec)
    if not file_path.is_absolute():
        resolved = base / file_path
        if not file_path.exists() or resolved.exists():
            file_path = resolved
    return f"{file_path}:{column}" if column else str(file_path)


def build_inputs(config_path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PlanInputs:
    """Merge a config file with flag overrides (None means "not given") and load referenced files."""
    values: dict[str, Any] = load_config_file(config_path) if config_path is not None else {}
    given = {field: value for field, value in (overrides or {}).items() if value not in (None, [], ())}
    # A flag giving a length one way replaces the file's value given the other way.
    for mean_field, lengths_field in (("output_mean", "output_lengths"), ("prompt_mean", "prompt_lengths")):
        if mean_field in given:
            values.pop(lengths_field, None)
        if lengths_field in given:
            values.pop(mean_field, None)
    values.update(given)
    for field in ("output_lengths", "prompt_lengths"):
        spec = values.get(field)
        if isinstance(spec, (str, Path)):
            values[field] = load_lengths(spec).tolist()
            values.setdefault(f"{field}_source", str(spec))
    if isinstance(values.get("bench"), (str, Path)):
        values["bench"] = load_bench(values["bench"])
    return validate_inputs(values)


def build_train_inputs(config_path: str | Path | None = None, overrides: dict[str, Any] | None = None):
    """`plan --train` inputs from a config file and flag overrides (flags win), as `TrainPlanInputs`."""
    from draftsmith.plan.training import validate_train_inputs

    values: dict[str, Any] = load_config_file(config_path, TRAIN_KEY_TO_FIELD) if config_path is not None else {}
    values.update({field: value for field, value in (overrides or {}).items() if value not in (None, [], ())})
    output_mean, prompt_mean = values.pop("output_mean", None), values.pop("prompt_mean", None)
    if values.get("mean_length") is None and output_mean is not None:
        values["mean_length"] = float(parse_count(output_mean, "--output-mean")) + float(
            parse_count(prompt_mean, "--prompt-mean") if prompt_mean is not None else 0
        )
    if values.get("mean_length") is None and "samples" in values:
        raise InputError("plan --train needs --mean-length (tokens per sample, prompt + completion) or --output-mean")
    return validate_train_inputs(values)
