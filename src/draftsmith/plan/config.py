"""The settings of `draftsmith plan` (a regeneration run) and `draftsmith plan train` (a drafter
training run). Their CLI options come from these models; a YAML/TOML/JSON file (`--config`) takes
the same keys as the flags, with hyphens or underscores, and flags given on the command line win:

    samples: 914000
    output-mean: 2500          # or output-lengths: pilot.jsonl:completion_tokens
    per-gpu: 400 tok/s
    gpus: 4
    claimed-rate: 5.4M/day
    deadline: 7d
    model-config: /models/target/config.json
    disk: 90TB

Values stay as a person writes them ("914k", "400 tok/s"); `PlanInputs` / `TrainPlanInputs` parse
and check them, so a bad value is one line naming its flag. Relative paths in a file are relative
to the file, so a plan file can live next to its data. One file can serve both plans: `plan train`
adds `output-mean` and `prompt-mean` up to its mean length when `mean-length` is not given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from draftsmith.core.config import cli, options_of, read_config_file, validate_config
from draftsmith.core.errors import InputError
from draftsmith.core.units import parse_count
from draftsmith.plan.bench_result import load_bench
from draftsmith.plan.capacity import PlanInputs, validate_inputs
from draftsmith.plan.distribution import load_lengths, split_source_spec


class FileRelative:
    """Marks a path field: a relative path in a plan file is read relative to the file."""


def _number_as_text(value: Any) -> Any:
    # A file's `gpus: 4` is the flag's "4"; a boolean is no count and stays an error.
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Text = Annotated[str | None, BeforeValidator(_number_as_text)]
"""A value as a person writes it ("914k", "400 tok/s", 4); the plan inputs parse it."""
PathSpec = Annotated[str | None, FileRelative()]


class PlanConfig(BaseModel):
    """`draftsmith plan`: how long regenerating a dataset takes, what GPUs and disk it needs."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    samples: Annotated[Text, cli("--samples", "--num-samples", metavar="N")] = Field(
        None, description="number of samples to generate (914000, 914k)")
    output_mean: Annotated[Text, cli(metavar="TOKENS")] = Field(None, description="average output tokens per sample")
    output_lengths: Annotated[PathSpec, cli(metavar="FILE[:COLUMN]")] = Field(
        None, description="observed output lengths: FILE[:COLUMN] (JSONL, Parquet, CSV, text)")
    prompt_mean: Annotated[Text, cli(metavar="TOKENS")] = Field(None, description="average prompt tokens per sample")
    prompt_lengths: Annotated[PathSpec, cli(metavar="FILE[:COLUMN]")] = Field(
        None, description="observed prompt lengths: FILE[:COLUMN]")
    max_tokens: Annotated[Text, cli(metavar="TOKENS")] = Field(
        None, description="cap on output tokens; truncates the distribution")
    per_gpu: Annotated[Text, cli(metavar="RATE")] = Field(None, description="throughput of one GPU/server ('400 tok/s')")
    gpus: Annotated[Text, cli(metavar="N")] = Field(None, description="number of GPUs/servers")
    efficiency: Annotated[float | None, cli(metavar="FRACTION")] = Field(
        None, description="scaling efficiency beyond one GPU (0-1]")
    throughput: Annotated[Text, cli(metavar="RATE")] = Field(
        None, description="total throughput ('1,600 tok/s', '5.76M/hour')")
    bench: Annotated[PathSpec, cli(metavar="FILE")] = Field(None, description="saved `draftsmith bench` JSON; its knee is per GPU")
    claimed_rates: Annotated[list[str], cli("--claimed-rate", "--claimed-rates", split=False, metavar="RATE")] = Field(
        default_factory=list, description="a rate quoted elsewhere ('5.4M/day'), cross-checked; repeatable")
    use_rate: Annotated[Text, cli(metavar="NAME")] = Field(
        None, description="when rates disagree, the one to plan on: bench, per-gpu, throughput, claimed")
    rate_tolerance: Annotated[float | None, cli(metavar="FRACTION")] = Field(
        None, description="relative gap two rates may have (0.1)")
    deadline: Annotated[Text, cli(metavar="DURATION")] = Field(
        None, description="finish within this time ('7d', '36h'): GPUs needed")
    model_config_path: Annotated[PathSpec, cli("--model-config", metavar="PATH")] = Field(
        None, description="target's config.json (or model dir)")
    hidden_size: Annotated[Text, cli(metavar="N")] = Field(None, description="target hidden size (instead of --model-config)")
    captured_layers: Annotated[Text, cli(metavar="N")] = Field(None, description="target layers captured (DFlash: 5)")
    dtype: Annotated[Text, cli(metavar="DTYPE")] = Field(None, description="hidden-state dtype on disk (bfloat16)")
    disk: Annotated[Text, cli(metavar="SIZE")] = Field(
        None, description="disk budget for offline hidden states ('90TB', '2 TiB')")
    sensitivity_factors: Annotated[list[float] | None, cli(metavar="F,F,...")] = Field(
        None, description="throughput and length factors of the sensitivity table (0.5,0.75,1,1.25,1.5,2)")
    gpu_counts: Annotated[list[int] | None, cli(metavar="N,N,...")] = Field(
        None, description="GPU counts of the scaling table (1,2,4,...,64)")
    gpu: Annotated[Text, cli(metavar="NAME")] = Field(
        None, description="with --model-config: the GPU (see `plan engine`); prints the decode ceiling beside the days")
    concurrency: Annotated[Text, cli(metavar="N|auto")] = Field(
        None, description="with --gpu: requests in flight per GPU for the ceiling (the bench knee's, else auto)")
    weights: Annotated[Literal["bf16", "fp8", "fp4", "int4"] | None, cli(metavar="DTYPE")] = Field(
        None, description="with --gpu: weight dtype for the ceiling (bf16)")
    kv_cache: Annotated[Literal["auto", "bf16", "fp8"] | None, cli(metavar="DTYPE")] = Field(
        None, description="with --gpu: KV cache dtype for the ceiling (auto)")
    engine: Annotated[Literal["ideal", "sglang", "vllm"] | None, cli(metavar="NAME")] = Field(
        None, description="with --gpu: whose state copies and caps the ceiling assumes (ideal)")

    def to_inputs(self) -> PlanInputs:
        """The parsed, checked plan inputs, with the length and bench files read."""
        values = _given(self)
        for name in ("output_lengths", "prompt_lengths"):
            if name in values:
                values[f"{name}_source"] = values[name]
                values[name] = load_lengths(values[name]).tolist()
        if "bench" in values:
            values["bench"] = load_bench(values["bench"])
        return validate_inputs(values)


class TrainPlanConfig(BaseModel):
    """`draftsmith plan train`: wall time (online or offline) and memory per GPU of a training run."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    samples: Annotated[Text, cli("--samples", "--num-samples", metavar="N")] = Field(
        None, description="training samples (sequences) per epoch")
    mean_length: Annotated[Text, cli(metavar="TOKENS")] = Field(
        None, description="mean tokens per sample (prompt + completion)")
    output_mean: Annotated[Text, cli(metavar="TOKENS")] = Field(
        None, description="instead of --mean-length: mean completion tokens (plus --prompt-mean)")
    prompt_mean: Annotated[Text, cli(metavar="TOKENS")] = Field(
        None, description="with --output-mean: mean prompt tokens")
    max_length: Annotated[Text, cli(metavar="TOKENS")] = Field(
        None, description="longest sequence; memory is planned for it (3072)")
    epochs: Annotated[Text, cli(metavar="N")] = Field(None, description="passes over the data (6)")
    num_anchors: Annotated[Text, cli(metavar="N")] = Field(None, description="blocks per sequence (512)")
    block_size: Annotated[Text, cli(metavar="B")] = Field(None, description="block size (16)")
    draft_layers: Annotated[Text, cli(metavar="N")] = Field(None, description="drafter layers (5)")
    captured_layers: Annotated[Text, cli("--captured-layers", "--num-features", metavar="N")] = Field(
        None, description="captured target layers, k (5)")
    batch_size: Annotated[Text, cli(metavar="N")] = Field(None, description="sequences per micro-batch per GPU (1)")
    gpus: Annotated[Text, cli(metavar="N")] = Field(None, description="GPUs training together (1)")
    gpu: Annotated[Text, cli(metavar="TYPE")] = Field(
        None, description="GPU type for peak FLOP/s and memory (the catalogue of `plan engine`): h100, h200, b200, "
                          "a100-80gb, l40s, rtx-pro-6000-server, rtx-pro-6000-workstation")
    gpu_flops: Annotated[Text, cli(metavar="FLOPS")] = Field(None, description="peak bf16 FLOP/s per GPU ('989T')")
    gpu_memory: Annotated[Text, cli(metavar="SIZE")] = Field(None, description="memory per GPU ('80GB')")
    mfu: Annotated[float | None, cli(metavar="FRACTION")] = Field(None, description="model FLOP utilization (0.35)")
    offline: Annotated[bool | None, cli("--offline/--online")] = Field(
        None, description="from stored features, or with the target in the loop (default)")
    attention: Annotated[Text, cli(metavar="KIND")] = Field(
        None, description="drafter attention for the headline: sparse or dense")
    dtype: Annotated[Text, cli(metavar="DTYPE")] = Field(None, description="target weights and activations (bfloat16)")
    model_config_path: Annotated[PathSpec, cli("--model-config", metavar="PATH")] = Field(
        None, description="target's config.json or model directory [required]")
    train_bench: Annotated[PathSpec, cli(metavar="FILE")] = Field(
        None, description="`train --benchmark-steps` JSON: plan on its measured rate")

    def to_inputs(self):
        """The parsed, checked `TrainPlanInputs`."""
        from draftsmith.plan.training import validate_train_inputs

        values = _given(self)
        output_mean, prompt_mean = values.pop("output_mean", None), values.pop("prompt_mean", None)
        if "mean_length" not in values and output_mean is not None:
            values["mean_length"] = float(parse_count(output_mean, "--output-mean")) + float(
                parse_count(prompt_mean, "--prompt-mean") if prompt_mean is not None else 0)
        if "mean_length" not in values and "samples" in values:
            raise InputError("plan train needs --mean-length (tokens per sample, prompt + completion) or --output-mean")
        if "captured_layers" in values:
            values["num_features"] = values.pop("captured_layers")
        return validate_train_inputs(values)


class EnginePlanConfig(BaseModel):
    """`draftsmith plan engine`: the decode ceiling of a model on given GPUs, the share a measured rate is
    of it, and the knobs that close the gap."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_config_path: Annotated[PathSpec, cli("--model-config", metavar="PATH")] = Field(
        None, description="the model's config.json or model directory")
    gpu: Annotated[Text, cli(metavar="NAME")] = Field(
        None, description="GPU from the catalogue: rtx-pro-6000-server, rtx-pro-6000-workstation, h100, h200, b200, "
                          "a100-80gb, l40s")
    gpu_bandwidth: Annotated[Text, cli(metavar="RATE")] = Field(None, description="memory bandwidth per GPU ('8 TB/s')")
    gpu_memory: Annotated[Text, cli(metavar="SIZE")] = Field(None, description="memory per GPU ('288GB')")
    gpu_tflops: Annotated[Text, cli(metavar="TFLOPS")] = Field(None, description="dense bf16 TFLOP/s per GPU (FP8 2x, FP4 4x)")
    gpus: Annotated[Text, cli(metavar="N")] = Field(None, description="GPUs (1)")
    tp: Annotated[Text, cli(metavar="N")] = Field(None, description="tensor-parallel degree of one replica (1)")
    weights: Annotated[Literal["bf16", "fp8", "fp4", "int4"] | None, cli(metavar="DTYPE")] = Field(
        None, description="weight dtype: bf16, fp8, fp4, int4 (bf16)")
    kv_cache: Annotated[Literal["auto", "bf16", "fp8"] | None, cli(metavar="DTYPE")] = Field(
        None, description="KV cache dtype: auto (the model's, bf16), bf16, fp8")
    state_dtype: Annotated[Literal["fp32", "bf16"] | None, cli(metavar="DTYPE")] = Field(
        None, description="linear-attention state dtype (the config's mamba_ssm_dtype, else fp32)")
    concurrency: Annotated[Text, cli(metavar="N|auto")] = Field(None, description="requests in flight (auto: what fits)")
    prompt_mean: Annotated[Text, cli(metavar="TOKENS")] = Field(None, description="average prompt tokens")
    output_mean: Annotated[Text, cli(metavar="TOKENS")] = Field(None, description="average output tokens")
    output_lengths: Annotated[PathSpec, cli(metavar="FILE[:FIELD]")] = Field(
        None, description="observed output lengths (their tail raises the live context)")
    max_tokens: Annotated[Text, cli(metavar="TOKENS")] = Field(None, description="cap on output tokens")
    speculative: Annotated[Literal["none", "mtp", "drafter"] | None, cli(metavar="KIND")] = Field(
        None, description="speculative decoding: none, mtp (the model's MTP layers), drafter (a one-layer drafter)")
    draft_tokens: Annotated[Text, cli(metavar="K")] = Field(None, description="draft tokens per verify step (3)")
    acceptance: Annotated[Text, cli(metavar="TAU")] = Field(
        None, description="tokens accepted per verify step, the bonus token included (1..K+1)")
    engine: Annotated[Literal["ideal", "sglang", "vllm"] | None, cli(metavar="NAME")] = Field(
        None, description="whose state copies and default caps: ideal, sglang, vllm (ideal)")
    prefix_cache: Annotated[bool | None, cli("--prefix-cache/--no-prefix-cache")] = Field(
        None, description="SGLang's radix prefix cache (on by default: 5 state copies per request)")
    state_copies: Annotated[Text, cli(metavar="N")] = Field(None, description="state copies per request (overrides the engine's)")
    memory_utilization: Annotated[Text, cli(metavar="FRACTION")] = Field(
        None, description="share of GPU memory the engine may use (0.9)")
    efficiency: Annotated[Text, cli(metavar="FRACTION")] = Field(
        None, description="share of the ceiling a real engine reaches (0.7)")
    per_gpu: Annotated[Text, cli(metavar="RATE")] = Field(None, description="measured rate per GPU ('400 tok/s')")
    bench: Annotated[PathSpec, cli(metavar="FILE")] = Field(None, description="saved `draftsmith bench` JSON (its knee)")
    samples: Annotated[Text, cli("--samples", "--num-samples", metavar="N")] = Field(None, description="samples to generate ('914k')")
    params: Annotated[Text, cli(metavar="N")] = Field(None, description="parameter count, instead of the config's ('27B')")
    kv_bytes_per_token: Annotated[Text, cli(metavar="BYTES")] = Field(
        None, description="KV bytes per token in bf16, instead of the config's")
    state_bytes: Annotated[Text, cli(metavar="BYTES")] = Field(
        None, description="linear-attention state bytes per sequence, instead of the config's")


def _given(config: BaseModel) -> dict[str, Any]:
    """The settings given (by a flag or the file), as the plan inputs take them: None means "not given"."""
    return {name: value for name, value in config.model_dump().items() if value not in (None, [], ())}


def load_config_file(path: str | Path, model: type[BaseModel] = PlanConfig) -> dict[str, Any]:
    """Raw values from a YAML/TOML/JSON plan file, keyed by `model`'s field, relative paths made
    relative to the file. The keys are the model's flags (a `plan:` section is allowed)."""
    path = Path(path)
    data = read_config_file(path)
    if isinstance(data.get("plan"), dict) and len(data) == 1:
        data = data["plan"]
    options = {key: option for option in options_of(model) for key in option.keys()}
    values: dict[str, Any] = {}
    for key, value in data.items():
        option = options.get(str(key).replace("_", "-"))
        if option is None:
            raise InputError(f"{path}: unknown key {key!r} (known keys: {', '.join(sorted(options))})")
        field = option.path[0]
        if isinstance(value, str) and any(isinstance(m, FileRelative) for m in model.model_fields[field].metadata):
            value = _relative_to(value, path.parent)
        values[field] = option.coerce(value, f"{path}: {key}")
    return values


def _relative_to(spec: str, base: Path) -> str:
    file_path, column = split_source_spec(spec)
    if not file_path.is_absolute():
        resolved = base / file_path
        if not file_path.exists() or resolved.exists():
            file_path = resolved
    return f"{file_path}:{column}" if column else str(file_path)


def _merge(model: type[BaseModel], config_path: str | Path | None, overrides: dict[str, Any] | None) -> BaseModel:
    """`model` from a file and flag overrides (None means "not given"; flags win)."""
    values = load_config_file(config_path, model) if config_path is not None else {}
    given = {field: value for field, value in (overrides or {}).items() if value not in (None, [], ())}
    # A flag giving a length one way replaces the file's value given the other way.
    for mean_field, lengths_field in (("output_mean", "output_lengths"), ("prompt_mean", "prompt_lengths")):
        if mean_field in given:
            values.pop(lengths_field, None)
        if lengths_field in given:
            values.pop(mean_field, None)
    values.update(given)
    return validate_config(model, values, {"model_config_path": "--model-config", "claimed_rates": "--claimed-rate"})


def build_inputs(config_path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PlanInputs:
    """`plan` inputs from a config file and flag overrides (keyed by `PlanConfig` field; flags win)."""
    return _merge(PlanConfig, config_path, overrides).to_inputs()


def build_train_inputs(config_path: str | Path | None = None, overrides: dict[str, Any] | None = None):
    """`plan train` inputs from a config file and flag overrides, as `TrainPlanInputs`."""
    return _merge(TrainPlanConfig, config_path, overrides).to_inputs()
