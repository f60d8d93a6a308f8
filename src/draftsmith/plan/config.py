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
from typing import Any

from draftsmith.core.config import read_config_file
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
