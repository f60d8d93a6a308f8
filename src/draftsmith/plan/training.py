"""The training plan: wall time and per-GPU memory of a drafter training run, online or offline.

`make_train_plan(TrainPlanInputs(...)) -> TrainPlan`. Symbols: T tokens per sequence, N anchors
(at most T-1), B block size, Q = N*B block tokens, M = N*(B-1) scored predictions, L target layers,
Ld drafter layers, k captured layers, H hidden, I intermediate, V vocab, a = heads*head_dim,
g = kv_heads*head_dim, P_layer one decoder layer's parameters (the drafter copies the target's).

FLOPs per sequence (time uses T = the mean length):
- target forward (online only; offline reads stored features): 2*L*P_layer*T + 2*L*a*T^2 (causal
  attention); the embedding is a lookup and the LM head is not run for features.
- drafter forward+backward: 6*(Q*Ld*P_layer + T*(k*H*H + Ld*2*H*g)), i.e. every layer on the block
  tokens plus the fc fusion and the K/V projections of the context; 4*M*V*H for the frozen LM head
  (forward and the gradient to its input, none to its weight); 12*Ld*a*Q*K for attention, where a
  block sees K = T+Q keys dense and K = T/2+B sparse (the context before its anchor, anchors spread
  over the sequence, plus its own block).
- wall time = samples*epochs*FLOPs / (GPUs * peak * MFU), or with a measured `train --benchmark-steps`
  rate: samples*epochs*T / (tokens/s per GPU * GPUs).

Memory per GPU (micro-batch of S sequences at T = max length, b bytes per activation):
- target weights: P_target*b online; embedding + LM head only offline;
- target activations (online): S*T*(L+1)*H*b (all hidden states returned) + S*T*(2H+3I)*b (one layer);
- features: S*T*k*H*b online, *4 offline (read into fp32);
- drafter states: P_drafter*16 (fp32 weights and grads, AdamW m and v);
- drafter activations: S*b*(Ld*(Q*(6H+4I) + (T+Q)*2*(a+g)) + T*H);
- logits: R*V*(b + 4 + 4) with R = min(S*M, 1024): train's loss scores the M predictions 1024 rows at a
  time and recomputes each chunk in backward, so one chunk's logits, their fp32 copy for
  cross-entropy and its gradient are alive at once;
- attention workspace: S*Ld*heads*Q*K*b (scores saved for backward), K as above; dense also holds the
  boolean mask S*Q*(T+Q).

With `train --sharding fsdp` over G GPUs (FSDP2 over the drafter's layers and the frozen target), the
target weights and the drafter states are divided by G, and each GPU also holds the all-gathered
working set: three drafter layers in fp32 (the one computing, the next one prefetched, and the
unsharded gradient before its reduce-scatter), 12*P_layer, plus the LM head whole in b (V*H*b),
which the loss scores every chunk with. Activations are per rank either way.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from draftsmith.core.config import validate_config
from draftsmith.core.errors import InputError
from draftsmith.model.storage import dtype_size
from draftsmith.plan.capacity import WallTime
from draftsmith.plan.gpus import find_gpu, gpu_names
from draftsmith.model.shape import TargetShape, read_target_shape
from draftsmith.plan.train_bench import TrainBenchSummary, load_train_bench
from draftsmith.core.units import parse_count, parse_size

# A drafter step is dominated by large GEMMs (target forward, drafter layers, LM head); 35% of peak
# is what well-tuned bf16 training of models this size reaches without heroic kernels.
DEFAULT_MFU = 0.35
OPTIMIZER_BYTES_PER_PARAM = 16  # fp32 weight + fp32 grad + AdamW m and v
LOSS_CHUNK_ROWS = 1024  # train's loss scores this many predictions per LM-head chunk (train.loss.DEFAULT_CHUNK_ROWS)
FSDP_GATHERED_DRAFTER_LAYERS = 3  # computing, prefetched, unsharded gradient


class TrainPlanInputs(BaseModel):
    """What `plan --train` is given; the defaults are the paper's recipe on H100s."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    samples: int = Field(description="training samples (sequences) per epoch")
    mean_length: float = Field(description="mean tokens per sample, prompt + completion")
    max_length: int = Field(3072, description="longest sequence (memory is planned for it)")
    epochs: int = Field(6, description="passes over the data")
    num_anchors: int = Field(512, description="blocks per sequence (N)")
    block_size: int = Field(16, ge=2, description="block size (B)")
    draft_layers: int = Field(5, description="drafter decoder layers")
    num_features: int = Field(5, description="captured target layers (k)")
    batch_size: int = Field(1, description="sequences per micro-batch per GPU")
    gpus: int = Field(1, description="GPUs training together (data parallel)")
    gpu: str = Field("H100", description=f"GPU type for peak FLOP/s and memory: {', '.join(gpu_names())}")
    gpu_flops: float | None = Field(None, description="peak bf16 FLOP/s per GPU (overrides --gpu's)")
    gpu_memory: int | None = Field(None, description="memory per GPU in bytes (overrides --gpu's)")
    mfu: float = Field(DEFAULT_MFU, gt=0, le=1, description="model FLOP utilization")
    offline: bool = Field(False, description="train from stored features (no target forward)")
    attention: Literal["sparse", "dense"] = Field("sparse", description="drafter attention the headline uses")
    dtype: str = Field("bfloat16", description="target weights and activation dtype")
    model_config_path: str = Field(description="target's config.json or model directory")
    train_bench: TrainBenchSummary | None = Field(None, description="measured `train --benchmark-steps` result")

    @field_validator("samples", "max_length", "epochs", "num_anchors", "draft_layers", "num_features", "batch_size", "gpus", mode="before")
    @classmethod
    def _count(cls, value: Any, info) -> Any:
        number = parse_count(value, f"--{info.field_name.replace('_', '-')}")
        if number <= 0 or number != int(number):
            raise InputError(f"--{info.field_name.replace('_', '-')} must be a positive whole number, got {value!r}")
        return int(number)

    @field_validator("mean_length", mode="before")
    @classmethod
    def _length(cls, value: Any) -> Any:
        number = parse_count(value, "--mean-length")
        if number <= 1:
            raise InputError(f"--mean-length must be more than 1 token, got {value!r}")
        return number

    @field_validator("gpu_flops", mode="before")
    @classmethod
    def _flops(cls, value: Any) -> Any:
        if value is None:
            return None
        number = parse_count(value, "--gpu-flops")
        if number <= 0:
            raise InputError(f"--gpu-flops must be positive, got {value!r}")
        return number

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        return None if value is None else parse_size(value, "--gpu-memory")

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str) -> str:
        # The one catalogue `plan engine` uses too (plan.gpus); "H100", "A100" still name their entries.
        find_gpu(value, instead="--gpu-flops and --gpu-memory")
        return value.upper()

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        dtype_size(value)
        return value

    @field_validator("train_bench", mode="before")
    @classmethod
    def _bench(cls, value: Any) -> Any:
        return load_train_bench(value) if isinstance(value, str) else value


def validate_train_inputs(data: dict[str, Any] | TrainPlanInputs) -> TrainPlanInputs:
    if isinstance(data, TrainPlanInputs):
        return data
    return validate_config(TrainPlanInputs, data, {"model_config_path": "--model-config"})


class SequenceFlops(BaseModel):
    """FLOPs to train on one sequence of `tokens` tokens."""

    tokens: float
    anchors: int
    block_tokens: int
    target_forward: float
    drafter_linear: float
    drafter_lm_head: float
    drafter_attention: float
    visible_keys: float

    @property
    def total(self) -> float:
        return self.target_forward + self.drafter_linear + self.drafter_lm_head + self.drafter_attention


class TrainTime(BaseModel):
    attention: str
    source: str  # "estimate" or "train-bench"
    flops_per_sequence: SequenceFlops | None
    total_flops: float | None
    tokens_per_s_per_gpu: float
    wall_time: WallTime


class MemoryBreakdown(BaseModel):
    attention: str
    sharding: str = "ddp"  # ddp (every GPU holds everything) or fsdp (sharded over `gpus`)
    gpus: int = 1
    target_weights: int
    target_activations: int
    features: int
    drafter_states: int
    drafter_activations: int
    logits: int
    attention_workspace: int
    fsdp_gathered: int = 0  # FSDP's all-gathered layers and LM head (0 under DDP)
    total: int
    fits: bool | None


class TrainPlan(BaseModel):
    inputs: dict[str, Any]
    mode: str
    target_params: int
    target_layer_params: int
    drafter_params: int
    total_sequences: int
    total_tokens: float
    peak_flops: float
    gpu_memory: int
    headline: TrainTime
    times: list[TrainTime]  # sparse and dense estimates (and the measured rate when given)
    memory: list[MemoryBreakdown]  # sparse, dense under DDP
    memory_fsdp: list[MemoryBreakdown]  # sparse, dense under FSDP over `gpus`
    warnings: list[str] = Field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "draftsmith.plan.train", "version": 1, **self.model_dump(mode="json")}


def drafter_params(shape: TargetShape, draft_layers: int, num_features: int) -> int:
    """Trainable drafter parameters: its layers, the fc fusing k target layers, two norms."""
    return draft_layers * shape.layer_params() + num_features * shape.hidden_size**2 + 2 * shape.hidden_size


def _anchors(inputs: TrainPlanInputs, tokens: float) -> int:
    return int(min(inputs.num_anchors, max(1, int(tokens) - 1)))


def _visible_keys(tokens: float, block_tokens: int, block_size: int, attention: str) -> float:
    return tokens + block_tokens if attention == "dense" else tokens / 2 + block_size


def sequence_flops(shape: TargetShape, inputs: TrainPlanInputs, tokens: float, attention: str) -> SequenceFlops:
    h, ld = shape.hidden_size, inputs.draft_layers
    anchors = _anchors(inputs, tokens)
    q = anchors * inputs.block_size
    m = anchors * (inputs.block_size - 1)
    keys = _visible_keys(tokens, q, inputs.block_size, attention)
    target = 0.0
    if not inputs.offline:
        target = 2 * shape.num_layers * shape.layer_params() * tokens + 2 * shape.num_layers * shape.attention_width * tokens**2
    linear = 6 * (q * ld * shape.layer_params() + tokens * (inputs.num_features * h * h + ld * 2 * h * shape.kv_width))
    return SequenceFlops(
        tokens=tokens,
        anchors=anchors,
        block_tokens=q,
        target_forward=target,
        drafter_linear=linear,
        drafter_lm_head=4 * m * shape.vocab_size * h,
        drafter_attention=12 * ld * shape.attention_width * q * keys,
        visible_keys=keys,
    )


def memory_per_gpu(
    shape: TargetShape, inputs: TrainPlanInputs, attention: str, gpu_memory: int | None, sharding: str = "ddp"
) -> MemoryBreakdown:
    b = dtype_size(inputs.dtype)
    s, t = inputs.batch_size, inputs.max_length
    h, i, ld = shape.hidden_size, shape.intermediate_size, inputs.draft_layers
    anchors = _anchors(inputs, t)
    q = anchors * inputs.block_size
    m = anchors * (inputs.block_size - 1)
    keys = _visible_keys(t, q, inputs.block_size, attention)
    if inputs.offline:
        weights = (shape.embedding_params() + shape.lm_head_params()) * b
        target_activations = 0
        features = s * t * inputs.num_features * h * 4
    else:
        weights = shape.params() * b
        target_activations = s * t * (shape.num_layers + 1) * h * b + s * t * (2 * h + 3 * i) * b
        features = s * t * inputs.num_features * h * b
    states = drafter_params(shape, ld, inputs.num_features) * OPTIMIZER_BYTES_PER_PARAM
    activations = s * b * (ld * (q * (6 * h + 4 * i) + (t + q) * 2 * (shape.attention_width + shape.kv_width)) + t * h)
    logits = min(s * m, LOSS_CHUNK_ROWS) * shape.vocab_size * (b + 4 + 4)
    workspace = s * ld * shape.num_heads * q * keys * b
    if attention == "dense":
        workspace += s * q * (t + q)
    gathered, gpus = 0, inputs.gpus if sharding == "fsdp" else 1
    if sharding == "fsdp":
        weights, states = weights / gpus, states / gpus
        gathered = FSDP_GATHERED_DRAFTER_LAYERS * shape.layer_params() * 4 + shape.lm_head_params() * b
    parts = [int(weights), int(target_activations), int(features), int(states), int(activations), int(logits),
             int(workspace), int(gathered)]  # fmt: skip
    total = sum(parts)
    return MemoryBreakdown(
        attention=attention,
        sharding=sharding,
        gpus=gpus,
        fsdp_gathered=parts[7],
        target_weights=parts[0],
        target_activations=parts[1],
        features=parts[2],
        drafter_states=parts[3],
        drafter_activations=parts[4],
        logits=parts[5],
        attention_workspace=parts[6],
        total=total,
        fits=(total <= gpu_memory) if gpu_memory else None,
    )


def make_train_plan(inputs: TrainPlanInputs | dict[str, Any]) -> TrainPlan:
    """Wall time and per-GPU memory of training a drafter. Raises `InputError` on bad input."""
    inputs = validate_train_inputs(inputs)
    shape = read_target_shape(inputs.model_config_path)
    warnings: list[str] = []
    if inputs.num_features > shape.num_layers:
        # As the trainer does: a shallow target gives each of its layers once.
        warnings.append(f"--captured-layers {inputs.num_features} is more than the target's {shape.num_layers} layers; planning on {shape.num_layers}")
        inputs = inputs.model_copy(update={"num_features": shape.num_layers})
    if inputs.mean_length > inputs.max_length:
        raise InputError(f"--mean-length {inputs.mean_length:g} is above --max-length {inputs.max_length}")
    gpu = find_gpu(inputs.gpu)
    peak_flops, table_memory = gpu.bf16_flops, gpu.memory_bytes
    if inputs.gpu_flops is not None:
        peak_flops = inputs.gpu_flops
    gpu_memory = inputs.gpu_memory or table_memory
    mode = "offline" if inputs.offline else "online"
    sequences = inputs.samples * inputs.epochs
    total_tokens = sequences * inputs.mean_length

    times: dict[str, TrainTime] = {}
    for attention in ("sparse", "dense"):
        per_sequence = sequence_flops(shape, inputs, inputs.mean_length, attention)
        total_flops = per_sequence.total * sequences
        seconds = total_flops / (inputs.gpus * peak_flops * inputs.mfu)
        times[attention] = TrainTime(
            attention=attention,
            source="estimate",
            flops_per_sequence=per_sequence,
            total_flops=total_flops,
            tokens_per_s_per_gpu=total_tokens / seconds / inputs.gpus,
            wall_time=WallTime.from_seconds(seconds),
        )
    headline = times[inputs.attention]
    ordered = [times["sparse"], times["dense"]]
    bench = inputs.train_bench
    if bench is not None:
        rate = bench.per_gpu_tokens_per_s
        measured = TrainTime(
            attention="measured",
            source="train-bench",
            flops_per_sequence=None,
            total_flops=None,
            tokens_per_s_per_gpu=rate,
            wall_time=WallTime.from_seconds(total_tokens / (rate * inputs.gpus)),
        )
        headline = measured
        ordered.insert(0, measured)
        if bench.mode != mode:
            warnings.append(f"the train benchmark ran {bench.mode} but this plan is {mode}; its rate does not carry over")
        warnings += _bench_device_warnings(bench.device, inputs.gpu)
        for key, field in (("block_size", "block_size"), ("num_anchors", "num_anchors"), ("num_draft_layers", "draft_layers"),
                           ("batch_size", "batch_size")):
            measured_value = bench.shapes.get(key)
            if measured_value is not None and measured_value != getattr(inputs, field):
                warnings.append(
                    f"the train benchmark ran with {key} {measured_value} but this plan has {getattr(inputs, field)}; "
                    f"benchmark the shapes you will train with"
                )
        ratio = inputs.mean_length / bench.mean_tokens_per_sample
        if not 2 / 3 <= ratio <= 1.5:
            warnings.append(
                f"the train benchmark averaged {bench.mean_tokens_per_sample:,.0f} tokens per sample but this plan "
                f"{inputs.mean_length:,.0f}; attention grows with length, so benchmark on data of this length"
            )
    memory = [memory_per_gpu(shape, inputs, attention, gpu_memory) for attention in ("sparse", "dense")]
    memory_fsdp = [memory_per_gpu(shape, inputs, attention, gpu_memory, "fsdp") for attention in ("sparse", "dense")]
    warnings += _memory_warnings(inputs, memory, memory_fsdp, gpu_memory)
    return TrainPlan(
        inputs=inputs.model_dump(mode="json"),
        mode=mode,
        target_params=shape.params(),
        target_layer_params=shape.target_layer_params(),
        drafter_params=drafter_params(shape, inputs.draft_layers, inputs.num_features),
        total_sequences=sequences,
        total_tokens=total_tokens,
        peak_flops=peak_flops,
        gpu_memory=gpu_memory,
        headline=headline,
        times=ordered,
        memory=memory,
        memory_fsdp=memory_fsdp,
        warnings=warnings,
    )


def _bench_device_warnings(device: str | None, gpu: str) -> list[str]:
    """A rate measured on another device than the plan's GPU plans the wrong run: say so."""
    if device is None:
        return []
    if not device.lower().startswith(("cuda", "gpu", "xpu", "rocm", "hip")):
        return [f"the train benchmark ran on {device}, but this plans a run on {gpu} GPUs: a CPU rate says nothing "
                f"about a GPU's; run `draftsmith train --benchmark-steps N` on the GPU you will train on"]
    if gpu.lower() not in device.lower():
        return [f"the train benchmark ran on {device}, but this plan is for {gpu}; the rate carries over only to the "
                "same GPU (pass --gpu for the one benchmarked)"]
    return []


def _memory_warnings(inputs: TrainPlanInputs, ddp: list[MemoryBreakdown], fsdp: list[MemoryBreakdown], gpu_memory: int) -> list[str]:
    """What to do when the chosen attention's run does not fit one GPU under DDP (or under FSDP)."""
    chosen = next(item for item in ddp if item.attention == inputs.attention)
    sharded = next(item for item in fsdp if item.attention == inputs.attention)
    if chosen.fits is not False:
        return []
    needs = f"the {inputs.attention} plan needs {chosen.total / 1e9:,.1f} GB per GPU with DDP, more than {gpu_memory / 1e9:,.0f} GB"
    if sharded.fits:
        return [f"{needs}: train with --sharding fsdp ({sharded.total / 1e9:,.1f} GB per GPU over {sharded.gpus} GPUs)"]
    return [f"{needs}, and {sharded.total / 1e9:,.1f} GB with FSDP over {sharded.gpus} GPUs: add GPUs or lower "
            f"--batch-size / --num-anchors / --max-length"]  # fmt: skip
