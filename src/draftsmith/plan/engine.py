"""`plan engine`: the decode ceiling of a model on given GPUs, how far a measured rate is from it,
and which knob closes the gap.

Per decode step, per GPU of one replica (TP degree t; one replica per GPU when t = 1), from
/work/shared/ROOFLINE.md (the repo's shared notes), written out here:

    bytes = W(B*q + p)/t + B*(L*kv + min(L, window)*kv_swa)/t' + B*c*state/t  (+ g*(W_draft/t + B*L*kv_draft/t'))
            + p*(kv + kv_swa)/t' + (B*tau/O)*state/t                             (prefill: KV and state writes)
    flops = (B*q*(2*P_active + attention(L)) + g*B*2*P_draft + p*(2*P_active + attention(P/2))) / t
    T     = max(bytes/BW, flops/peak) + T_allreduce          tok/s per GPU = B*tau/T/t

- W(B): every weight read in a step, the embedding excluded (a gather) and the LM head included; a
  MoE layer reads the experts the batch touches, E*(1-(1-k/E)^(B*q)) of E in expectation (each of
  the B*q tokens picks k of E, taken as independent and uniform).
- L: mean live context = prompt + E[O^2]/(2 E[O]) (a sequence is on average half-way through its
  output, weighted by how long it stays in the batch; prompt + O/2 for fixed lengths).
- kv: K and V bytes per token in the full-attention layers; sliding-window layers keep their window.
  t' splits KV heads over TP ranks (replicated when t exceeds them).
- state: Gated DeltaNet state per sequence (recurrent state in --state-dtype + conv state in bf16);
  c = 2 transfers (read + write) per step, plus one write per draft position under speculation in
  SGLang and vLLM (they keep a state per position to roll back rejected drafts).
- speculation: q = g+1 tokens verified per step, tau accepted per step (the bonus token included);
  MTP drafts g tokens one at a time, each reading the MTP layer and the LM head.
- memory cap: B_max = (memory*utilization - resident weights/t) / (copies*state/t + L*kv/t'), with
  the engine's state copies (SGLang: 3 slots per running request with its radix prefix cache plus
  2 ping-pong buffers under the overlap scheduler with `--mamba-scheduler-strategy extra_buffer` = 5;
  3 with the `no_buffer` strategy, so pass --state-copies 3 there; 1 with --disable-radix-cache; plus one per
  draft token under speculation; sglang/srt/model_executor/model_runner_kv_cache_mixin.py,
  MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3, MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP = 2)
  and its default caps (SGLang resets max running requests to 48 when speculating, server_args.py;
  vLLM's API server defaults to max_num_seqs 1024 on GPUs of 70 GiB or more except A100, else 256,
  vllm/engine/arg_utils.py).
- prefill (chunked, sharing steps with decode as vLLM and SGLang schedule it by default): B*tau/O
  sequences finish per step, so as many start, and their prompts add p = B*tau*P/O prompt tokens to
  each step: 2*P_active FLOPs each plus causal attention over the prompt (a prompt token sees P/2
  tokens on average), their KV written once and the new sequence's state written once; the weights
  are read once for both. The prefill share is the step time it adds (T with it less T without it, over
  T). The batch that fits is unchanged (every running sequence already holds its prompt's KV).
- MLA (DeepSeek-V3, Kimi K2): kv is the latent plus the rope key per layer, replicated on every TP rank.
- TP all-reduces: 2 per layer of B*q*hidden bf16 values, ring (2(t-1)/t of it over the link), each
  with ~10 us of latency on PCIe (5 us on NVLink); not overlapped with the step.

Real engines reach 0.6-0.8 of this ceiling on clean decode (--efficiency, 0.7 by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, Field

from draftsmith.core.errors import InputError
from draftsmith.core.limits import MAX_SEQUENCE_TOKENS  # a longer sequence is a typo, and overflows the arithmetic
from draftsmith.core.units import parse_count, parse_rate, parse_size
from draftsmith.plan.architecture import LINEAR, Architecture, Tensor, read_architecture
from draftsmith.plan.gpus import GpuSpec, check_device, find_gpu

SECONDS_PER_DAY = 86400
# Weight bytes per parameter: FP8 with one fp32 scale per 128x128 block (DeepSeek/Qwen FP8 checkpoints);
# NVFP4 with one FP8 scale per 16 values; int4 (GPTQ/AWQ) with one bf16 scale per 128 values.
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1 / 16, "int4": 0.5 + 2 / 128}
QUANT_BLOCK = 128
KV_BYTES = {"auto": 2, "bf16": 2, "fp8": 1}
STATE_BYTES = {"fp32": 4, "bf16": 2}
CONV_STATE_BYTES = 2  # the conv state is kept in the model dtype (bf16)
SGLANG_STATE_COPIES_RADIX = 5
SGLANG_SPECULATIVE_MAX_RUNNING = 48
VLLM_MAX_NUM_SEQS_LARGE, VLLM_MAX_NUM_SEQS_SMALL = 1024, 256
ALLREDUCE_LATENCY_S = {"pcie": 10e-6, "nvlink": 5e-6}
DEFAULT_EFFICIENCY = 0.7
DEFAULT_MEMORY_UTILIZATION = 0.9
# A speculative kind whose drafter the caller prices itself (plan/speculation.py): the target verifies
# draft_tokens + 1 tokens per step and nothing else is added for the drafter.
EXTERNAL_DRAFTER = "external"


@dataclass(frozen=True)
class Setup:
    """One deployment to evaluate: a knob is a `replace` of some of these."""

    arch: Architecture | None
    gpu: GpuSpec
    gpus: int
    tp: int
    weights: str
    kv_cache: str
    state_dtype: str
    engine: str
    prefix_cache: bool
    speculative: str
    draft_tokens: int
    acceptance: float
    memory_utilization: float
    context: float
    prompt: float = 0.0  # mean prompt tokens (prefill); 0: decode only
    output: float = 0.0  # mean output tokens (how often a sequence ends and a prompt is prefilled)
    params_override: float | None = None
    kv_override: float | None = None
    state_override: float | None = None
    state_copies_override: int | None = None
    lift_engine_cap: bool = False

    @property
    def speculating(self) -> bool:
        return self.speculative != "none"

    @property
    def gamma(self) -> int:
        return self.draft_tokens if self.speculating else 0

    @property
    def tau(self) -> float:
        return self.acceptance if self.speculating else 1.0


class Roofline(BaseModel):
    weights_bytes_per_step: float
    kv_bytes_per_token: float
    state_bytes_per_sequence: float
    state_copies: int
    resident_weight_bytes: float
    max_batch: int
    memory_max_batch: int
    engine_cap: int | None
    batch: int
    bytes_per_step: float
    flops_per_step: float
    step_time_bandwidth_s: float
    step_time_compute_s: float
    step_time_allreduce_s: float
    step_time_s: float
    bound: str
    ceiling_tokens_per_s_per_gpu: float
    prefill_tokens_per_step: float = 0.0
    prefill_share: float = 0.0  # of the step time, what prefilling the prompts adds


def _tensor_bytes(tensor: Tensor, weights: str) -> float:
    """Bytes of `tensor` stored as `weights`: the LM head, routers, norms and matrices whose sides are
    not multiples of the 128 quantization block stay bf16 (as in Qwen's FP8 checkpoints)."""
    if weights == "bf16" or tensor.role in ("embedding", "lm_head", "router", "vector"):
        return tensor.params * 2.0
    fused = 3 if tensor.name in ("mlp", "experts", "shared_expert") else 1  # gate, up, down of one width
    if (tensor.rows // fused) % QUANT_BLOCK or tensor.cols % QUANT_BLOCK:
        return tensor.params * 2.0
    if weights == "fp8":
        blocks = fused * math.ceil(tensor.rows / fused / QUANT_BLOCK) * math.ceil(tensor.cols / QUANT_BLOCK)
        return tensor.params + blocks * 4 * tensor.count
    return tensor.params * WEIGHT_BYTES[weights]


def experts_touched(experts: int, per_token: int, tokens: float) -> float:
    """Expected distinct experts `tokens` tokens route to, each picking `per_token` of `experts`."""
    if not experts:
        return 0.0
    return experts * (1 - (1 - per_token / experts) ** tokens)


def _read_bytes(arch: Architecture, weights: str, tokens: float, mtp: bool) -> float:
    """Weight bytes one forward over `tokens` tokens reads (the MTP module's with `mtp`; the LM head and,
    when tied, the embedding matrix serving as head are read either way)."""
    total = 0.0
    touched = experts_touched(arch.num_experts, arch.experts_per_token, tokens)
    for tensor in arch.tensors:
        head = tensor.role == "lm_head" or (tensor.role == "embedding" and arch.tie_word_embeddings)
        if tensor.role == "embedding" and not head:
            continue
        if tensor.mtp != mtp and not head:
            continue
        size = _tensor_bytes(tensor, weights)
        total += size * touched / arch.num_experts if tensor.role == "expert" else size
    return total


def _active_params(arch: Architecture, mtp: bool) -> float:
    """Parameters each token multiplies by: GEMMs and the head, k routed experts of E."""
    total = 0.0
    for tensor in arch.tensors:
        head = tensor.role == "lm_head" or (tensor.role == "embedding" and arch.tie_word_embeddings)
        if (tensor.role == "embedding" and not head) or (tensor.mtp != mtp and not head):
            continue
        total += tensor.params * arch.experts_per_token / arch.num_experts if tensor.role == "expert" else tensor.params
    return total


def _draft(setup: Setup) -> tuple[float, float, float, float]:
    """(weight bytes read per draft step at batch 1 token, its resident bytes, active params, KV elements per
    token) of the drafter: the MTP module, or for --speculative drafter one target-sized decoder layer."""
    arch = setup.arch
    if not setup.speculating or arch is None or setup.speculative == EXTERNAL_DRAFTER:
        return 0.0, 0.0, 0.0, 0.0
    if setup.speculative == "mtp":
        resident = sum(_tensor_bytes(t, setup.weights) for t in arch.tensors if t.mtp)
        # What a draft step reads depends on the batch (its MoE experts): `evaluate` computes it.
        return 0.0, resident, _active_params(arch, True), float(arch.mtp_kv_elements_per_token())
    layer = (_active_params(arch, False) - arch.vocab_size * arch.hidden_size) / arch.num_layers
    head = arch.vocab_size * arch.hidden_size * 2.0
    per_weight = WEIGHT_BYTES[setup.weights]
    return layer * per_weight + head, layer * per_weight, layer + arch.vocab_size * arch.hidden_size, \
        float(arch.kv_elements_per_layer())


def _kv_split(arch: Architecture | None, tp: int) -> float:
    """Share of the KV one GPU holds: KV heads split over TP ranks, replicated when fewer than the ranks;
    MLA's latent is one per token, replicated on every rank."""
    if arch is None or tp == 1:
        return 1 / tp
    if arch.mla:
        return 1.0
    return math.ceil(arch.num_kv_heads / tp) / arch.num_kv_heads


def state_copies(setup: Setup) -> int:
    if setup.state_copies_override is not None:
        return setup.state_copies_override
    base = SGLANG_STATE_COPIES_RADIX if setup.engine == "sglang" and setup.prefix_cache else 1
    return base + (setup.gamma if setup.engine in ("sglang", "vllm") else 0)


def engine_cap(setup: Setup) -> int | None:
    if setup.lift_engine_cap:
        return None
    if setup.engine == "sglang" and setup.speculating:
        return SGLANG_SPECULATIVE_MAX_RUNNING
    if setup.engine == "vllm":
        large = setup.gpu.memory_bytes >= 70 * 2**30 and "a100" not in setup.gpu.name
        return VLLM_MAX_NUM_SEQS_LARGE if large else VLLM_MAX_NUM_SEQS_SMALL
    return None


def per_token_bytes(setup: Setup) -> tuple[float, float, float]:
    """(KV bytes per token of full attention, of sliding-window layers, state bytes per sequence), whole model."""
    arch = setup.arch
    kv_size = KV_BYTES[setup.kv_cache]
    if setup.kv_override is not None:
        kv, kv_swa = setup.kv_override * kv_size / 2, 0.0
    else:
        assert arch is not None
        kv, kv_swa = arch.kv_elements_per_token() * kv_size, arch.kv_elements_per_token(sliding=True) * kv_size
    if setup.state_override is not None:
        state = setup.state_override
    elif arch is not None:
        state = arch.ssm_state_elements() * STATE_BYTES[setup.state_dtype] + arch.conv_state_elements() * CONV_STATE_BYTES
    else:
        state = 0.0
    return kv, kv_swa, state


@dataclass(frozen=True)
class StepTime:
    """One engine step on one GPU of a replica: what it moves and computes, and how long that takes."""

    bytes: float
    flops: float
    bandwidth_s: float
    compute_s: float
    allreduce_s: float
    seconds: float  # max(bandwidth_s, compute_s) + allreduce_s
    bound: str  # "bandwidth" or "compute"
    weights_bytes: float  # weight bytes read in the step, per GPU
    prefill_tokens: float = 0.0
    prefill_share: float = 0.0  # of `seconds`, what the prefill tokens add


def _resident_bytes(setup: Setup, draft_resident: float) -> float:
    arch = setup.arch
    if arch is not None:
        return sum(_tensor_bytes(tensor, setup.weights) for tensor in arch.tensors if not tensor.mtp) + draft_resident
    return setup.params_override * WEIGHT_BYTES[setup.weights]


def _step(setup: Setup, batch: float, tokens_per_seq: int, prefill_tokens: float, transfers: float) -> StepTime:
    """The step of `setup` with `batch` sequences each running `tokens_per_seq` tokens through the target
    (1 decoding, K+1 verifying), `prefill_tokens` prompt tokens sharing the step, `transfers` state transfers
    per sequence, plus the drafter's g draft passes when `setup` speculates."""
    arch, gpu, t = setup.arch, setup.gpu, setup.tp
    kv, kv_swa, state = per_token_bytes(setup)
    window = arch.sliding_window if arch is not None and arch.sliding_window else setup.context
    context_kv = setup.context * kv + min(setup.context, window) * kv_swa
    draft_read, draft_resident, draft_params, draft_kv_elements = _draft(setup)
    draft_kv = draft_kv_elements * KV_BYTES[setup.kv_cache]
    split = _kv_split(arch, t)
    gamma, b = setup.gamma, max(batch, 1)

    def cost(prefill: float) -> tuple[float, float, float]:
        tokens = b * tokens_per_seq + prefill
        if arch is not None:
            weights = _read_bytes(arch, setup.weights, tokens, mtp=False)
            active = _active_params(arch, False)
            attention = arch.attention_flops_per_token(setup.context)
            prompt_attention = arch.attention_flops_per_token(setup.prompt / 2, prefill=True)
            draft = _read_bytes(arch, setup.weights, b, mtp=True) if setup.speculative == "mtp" else draft_read
        else:
            weights, active, attention, prompt_attention = _resident_bytes(setup, 0.0), setup.params_override, 0.0, 0.0
            draft = draft_read
        started = prefill / setup.prompt if setup.prompt else 0.0  # sequences whose prompt this step prefills
        step_bytes = (weights / t + b * context_kv * split + b * transfers * state / t
                      + gamma * (draft / t + b * setup.context * draft_kv * split)
                      + prefill * (kv + kv_swa) * split + started * state / t)
        step_flops = (b * tokens_per_seq * (2 * active + attention) + gamma * b * 2 * draft_params
                      + prefill * (2 * active + prompt_attention)) / t
        return step_bytes, step_flops, weights / t

    step_bytes, step_flops, weights = cost(prefill_tokens)
    t_bandwidth = step_bytes / gpu.bandwidth_bytes_per_s
    t_compute = step_flops / gpu.peak_flops(setup.weights)
    t_allreduce = 0.0
    if t > 1 and arch is not None:
        size = (b * tokens_per_seq + prefill_tokens) * arch.hidden_size * 2
        latency = ALLREDUCE_LATENCY_S["nvlink" if gpu.nvlink else "pcie"]
        t_allreduce = 2 * arch.num_layers * (latency + 2 * (t - 1) / t * size / gpu.link_bytes_per_s)
    seconds = max(t_bandwidth, t_compute) + t_allreduce
    share = 0.0
    if prefill_tokens > 0:
        plain_bytes, plain_flops, _ = cost(0.0)
        plain = max(plain_bytes / gpu.bandwidth_bytes_per_s, plain_flops / gpu.peak_flops(setup.weights))
        if t > 1 and arch is not None:
            size = b * tokens_per_seq * arch.hidden_size * 2
            latency = ALLREDUCE_LATENCY_S["nvlink" if gpu.nvlink else "pcie"]
            plain += 2 * arch.num_layers * (latency + 2 * (t - 1) / t * size / gpu.link_bytes_per_s)
        share = max(seconds - plain, 0.0) / seconds
    return StepTime(bytes=step_bytes, flops=step_flops, bandwidth_s=t_bandwidth, compute_s=t_compute,
                    allreduce_s=t_allreduce, seconds=seconds, bound="bandwidth" if t_bandwidth >= t_compute else "compute",
                    weights_bytes=weights, prefill_tokens=prefill_tokens, prefill_share=share)


def _engine_transfers(setup: Setup) -> int:
    """State transfers per sequence and step: read + write, plus one write per draft position in SGLang/vLLM."""
    return 2 + (setup.gamma if setup.engine in ("sglang", "vllm") else 0)


def prefill_tokens_per_step(setup: Setup, batch: float) -> float:
    """Prompt tokens each step prefills in steady state: B*tau/O sequences end per step and as many start."""
    if not setup.prompt or not setup.output:
        return 0.0
    return max(batch, 1) * setup.tau * setup.prompt / setup.output


def step_time(arch: Architecture | None, gpu: GpuSpec, batch: int, tokens_per_seq: int, context: float, *,
              weights: str = "bf16", kv_cache: str = "auto", state_dtype: str = "fp32", tp: int = 1,
              state_transfers: float = 2, prefill_tokens: float = 0.0, prompt: float = 0.0,
              params: float | None = None, kv_bytes_per_token: float | None = None,
              state_bytes: float | None = None) -> StepTime:
    """The target's step on `gpu` for `batch` sequences each running `tokens_per_seq` tokens (1: plain decode;
    K+1: verifying K drafts) at `context` cached tokens per sequence, bandwidth- or compute-bound.

    No drafter cost is included (add the drafter's own steps); `prefill_tokens` prompt tokens of mean length
    `prompt` may share the step. Without `arch`, `params` and `kv_bytes_per_token` (bf16) stand in for it.
    `state_transfers`: linear-attention state reads + writes per sequence (2; engines that keep a state per
    draft position write K more)."""
    if arch is None and (params is None or kv_bytes_per_token is None):
        raise InputError("step_time needs an architecture, or params and kv_bytes_per_token")
    setup = Setup(arch=arch, gpu=gpu, gpus=tp, tp=tp, weights=weights, kv_cache=kv_cache, state_dtype=state_dtype,
                  engine="ideal", prefix_cache=False, speculative="none", draft_tokens=0, acceptance=1.0,
                  memory_utilization=DEFAULT_MEMORY_UTILIZATION, context=context, prompt=prompt,
                  params_override=params, kv_override=kv_bytes_per_token, state_override=state_bytes)
    return _step(setup, batch, tokens_per_seq, prefill_tokens, state_transfers)


def evaluate(setup: Setup, concurrency: int | None) -> Roofline:
    """The ceiling of `setup` at `concurrency` running requests (None: as many as fit), prefill included."""
    arch, gpu, t = setup.arch, setup.gpu, setup.tp
    kv, kv_swa, state = per_token_bytes(setup)
    window = arch.sliding_window if arch is not None and arch.sliding_window else setup.context
    context_kv = setup.context * kv + min(setup.context, window) * kv_swa
    _, draft_resident, _, draft_kv_elements = _draft(setup)
    draft_kv = draft_kv_elements * KV_BYTES[setup.kv_cache]
    copies = state_copies(setup)
    resident = _resident_bytes(setup, draft_resident)
    split = _kv_split(arch, t)
    per_sequence = copies * state / t + (context_kv + setup.context * draft_kv) * split
    free = gpu.memory_bytes * setup.memory_utilization - resident / t
    memory_max = int(min(free // per_sequence, 10**9)) if per_sequence > 0 and free > 0 else (0 if free <= 0 else 10**9)
    cap = engine_cap(setup)
    max_batch = min(memory_max, cap) if cap else memory_max
    batch = max_batch if concurrency is None else min(concurrency, max_batch)
    step = _step(setup, batch, setup.gamma + 1, prefill_tokens_per_step(setup, batch), _engine_transfers(setup))
    ceiling = batch * setup.tau / step.seconds / t if batch > 0 else 0.0
    return Roofline(
        weights_bytes_per_step=step.weights_bytes, kv_bytes_per_token=kv, state_bytes_per_sequence=state,
        state_copies=copies, resident_weight_bytes=resident / t, max_batch=max_batch, memory_max_batch=memory_max,
        engine_cap=cap, batch=batch, bytes_per_step=step.bytes, flops_per_step=step.flops,
        step_time_bandwidth_s=step.bandwidth_s, step_time_compute_s=step.compute_s,
        step_time_allreduce_s=step.allreduce_s, step_time_s=step.seconds, bound=step.bound,
        ceiling_tokens_per_s_per_gpu=ceiling, prefill_tokens_per_step=step.prefill_tokens,
        prefill_share=step.prefill_share,
    )


def mean_live_context(prompt_mean: float, output_mean: float, output_square_mean: float | None = None) -> float:
    """prompt + E[O^2] / (2 E[O]): fixed-length outputs give prompt + O/2; a long tail raises it."""
    square = output_mean**2 if output_square_mean is None else output_square_mean
    return prompt_mean + square / (2 * output_mean)


def days(samples: int | None, output_mean: float, tokens_per_s_per_gpu: float, gpus: int) -> float | None:
    if samples is None or tokens_per_s_per_gpu <= 0:
        return None
    return samples * output_mean / (tokens_per_s_per_gpu * gpus) / SECONDS_PER_DAY


class Knob(BaseModel):
    knob: str
    ceiling_tokens_per_s_per_gpu: float
    batch: int
    days: float | None
    gain: float  # ceiling over the configured one
    note: str
    prefill_share: float = 0.0


class EnginePlan(BaseModel):
    model: str
    gpu: str
    gpus: int
    tp: int
    engine: str
    weights: str
    kv_cache: str
    state_dtype: str
    speculative: str
    draft_tokens: int
    acceptance: float
    prompt_mean: float
    output_mean: float
    mean_context: float
    params: float | None
    weights_bytes_per_step: float
    kv_bytes_per_token: float
    state_bytes_per_sequence: float
    state_copies: int
    max_batch: int
    requested_concurrency: int | str
    batch: int
    step_time_s: float
    step_time_bandwidth_s: float
    step_time_compute_s: float
    step_time_allreduce_s: float
    bound: str
    ceiling_tokens_per_s_per_gpu: float
    prefill_tokens_per_step: float = 0.0
    prefill_share: float = 0.0
    efficiency: float
    measured_tokens_per_s_per_gpu: float | None = None
    measured_source: str | None = None
    measured_share: float | None = None
    samples: int | None = None
    days_at_ceiling: float | None = None
    days_at_efficiency: float | None = None
    days_at_measured: float | None = None
    knobs: list[Knob] = Field(default_factory=list)
    bench_context: dict[str, Any] | None = None
    warnings: list[str] = Field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "draftsmith.plan.engine", "version": 1, **self.model_dump(mode="json")}


def positive(value: Any, flag: str, integer: bool = False) -> float:
    """A positive finite number from a flag's text ("914k", 48, "0.7"), or one line naming the flag."""
    number = parse_count(value, flag)
    if number <= 0 or (integer and number != int(number)):
        kind = "whole number" if integer else "number"
        raise InputError(f"{flag} must be a positive {kind}, got {value!r}")
    return int(number) if integer else number


def tokens(value: Any, flag: str, integer: bool = False, allow_zero: bool = False) -> float:
    """A token count of one sequence (a mean or a cap), up to MAX_SEQUENCE_TOKENS."""
    number = parse_count(value, flag) if allow_zero else positive(value, flag, integer)
    if number > MAX_SEQUENCE_TOKENS:
        raise InputError(f"{flag} {value!r} is longer than any model's context (at most {MAX_SEQUENCE_TOKENS:,} tokens)")
    return int(number) if integer else number


def custom_gpu(bandwidth: Any, memory: Any, tflops: Any, base: GpuSpec | None) -> GpuSpec:
    """A GPU from --gpu-bandwidth/--gpu-memory/--gpu-tflops, each replacing --gpu's figure when both are given."""
    fields: dict[str, Any] = base.model_dump() if base else {"name": "custom", "title": "custom GPU", "nvlink": False,
                                                             "link_bytes_per_s": 64e9}
    missing = [flag for flag, value in (("--gpu-bandwidth", bandwidth), ("--gpu-memory", memory),
                                         ("--gpu-tflops", tflops)) if value is None]
    if base is None and missing:
        raise InputError(f"plan engine needs --gpu NAME, or all of --gpu-bandwidth, --gpu-memory and --gpu-tflops "
                         f"(missing {', '.join(missing)})")
    if bandwidth is not None:
        text = str(bandwidth).replace(" ", "")
        per_second = text.lower().removesuffix("/s").removesuffix("ps")
        fields["bandwidth_bytes_per_s"] = float(parse_size(per_second, "--gpu-bandwidth"))
        if fields["bandwidth_bytes_per_s"] <= 0:
            raise InputError(f"--gpu-bandwidth must be positive, got {bandwidth!r}")
    if memory is not None:
        fields["memory_bytes"] = parse_size(memory, "--gpu-memory")
        if fields["memory_bytes"] <= 0:
            raise InputError(f"--gpu-memory must be positive, got {memory!r}")
    if tflops is not None:
        peak = positive(tflops, "--gpu-tflops") * 1e12
        fields.update(bf16_flops=peak, fp8_flops=2 * peak, fp4_flops=4 * peak)
    return check_device(GpuSpec(**fields), "--gpu-bandwidth/--gpu-memory/--gpu-tflops: ")


def resolve_gpu(name: str | None, bandwidth: Any = None, memory: Any = None, tflops: Any = None) -> GpuSpec:
    base = find_gpu(name) if name is not None else None
    if base is not None and bandwidth is None and memory is None and tflops is None:
        return base
    return custom_gpu(bandwidth, memory, tflops, base)


def check_tp(arch: Architecture | None, tp: int, gpus: int) -> None:
    if gpus % tp:
        raise InputError(f"--tp {tp} does not divide --gpus {gpus} (replicas of {tp} GPUs each)")
    if arch is None or tp == 1:
        return
    for count, what in ((arch.num_heads, "attention heads"), (arch.linear_value_heads, "linear-attention value heads"),
                        (arch.linear_key_heads, "linear-attention key heads")):
        if count and count % tp:
            raise InputError(f"--tp {tp} does not divide the {count} {what} of {arch.source}")
    if arch.num_kv_heads % tp and tp % arch.num_kv_heads:
        raise InputError(f"--tp {tp} does not divide the {arch.num_kv_heads} KV heads of {arch.source} (nor they it)")


def load_architecture(path: str | None, params: Any, kv_override: Any, state_override: Any) -> Architecture | None:
    if path is not None:
        return read_architecture(path)
    if params is None or kv_override is None:
        raise InputError("plan engine needs --model-config (a config.json or model dir), or --params with "
                         "--kv-bytes-per-token (and --state-bytes for a hybrid model)")
    return None


def _knob_setups(setup: Setup, arch: Architecture | None) -> list[tuple[str, Setup, bool, str]]:
    """(knob, changed setup, evaluate at the memory cap?, note). Memory knobs only pay through the
    batch, so they are evaluated with the batch raised to what then fits."""
    server_cap = {"sglang": "--max-running-requests", "vllm": "--max-num-seqs"}.get(setup.engine, "the engine's cap")
    knobs = [("concurrency up to the memory cap", replace(setup, lift_engine_cap=True), True,
              f"send that many requests and raise {server_cap}; check the running batch in `bench` (/metrics)")]
    if setup.weights == "bf16":
        knobs.append(("FP8 weights", replace(setup, weights="fp8", lift_engine_cap=True), True,
                      "an FP8 checkpoint (LM head kept bf16): fewer bytes per step, room for a larger batch; check accuracy first"))
    if setup.kv_cache != "fp8" and (arch is None or arch.kv_elements_per_token() or arch.kv_elements_per_token(True)):
        knobs.append(("FP8 KV cache", replace(setup, kv_cache="fp8", lift_engine_cap=True), True,
                      "--kv-cache-dtype fp8_e4m3: half the KV bytes; check accuracy first (long thinking traces)"))
    hybrid = arch is not None and LINEAR in arch.layer_types or setup.state_override
    if hybrid and setup.state_dtype == "fp32":
        knobs.append(("bf16 linear-attention state", replace(setup, state_dtype="bf16", lift_engine_cap=True), True,
                      "half the state bytes (SGLang --mamba-ssm-dtype bfloat16); check accuracy first"))
    if hybrid and setup.engine == "sglang" and setup.prefix_cache and setup.state_copies_override is None:
        knobs.append(("no prefix cache (1 state copy)", replace(setup, prefix_cache=False, lift_engine_cap=True), True,
                      "--disable-radix-cache: unique prompts gain nothing from it, and it keeps 5 state copies per request"))
    if setup.speculating:
        knobs.append((f"speculation off ({setup.speculative})", replace(setup, speculative="none", lift_engine_cap=True), True,
                      "plain decoding at the batch that then fits: wins where verify FLOPs and state writes outweigh tau"))
    elif arch is not None and arch.mtp_layers and setup.acceptance > 1:
        knobs.append(("speculation on (MTP)", replace(setup, speculative="mtp", lift_engine_cap=True), True,
                      f"MTP with {setup.draft_tokens} draft tokens at the given acceptance {setup.acceptance:g}; "
                      f"pays while memory keeps the batch small"))
    if setup.tp > 1:
        knobs.append(("one replica per GPU (TP 1)", replace(setup, tp=1, lift_engine_cap=True), True,
                      "data parallel: no all-reduce" + (" over PCIe" if not setup.gpu.nvlink else "")
                      + "; needs the weights to fit one GPU"))
    elif setup.gpus > 1:
        knobs.append((f"TP {setup.gpus} (one replica)", replace(setup, tp=setup.gpus, lift_engine_cap=True), True,
                      "fewer weight bytes per GPU and room for a larger batch, paid in all-reduces"
                      + (" over PCIe (slow)" if not setup.gpu.nvlink else " over NVLink")))
    return knobs


def _tuned(setup: Setup, arch: Architecture | None) -> Setup:
    """Every memory and precision knob together: what a tuned deployment of the same GPUs allows."""
    tuned = replace(setup, weights="fp8" if setup.weights == "bf16" else setup.weights, kv_cache="fp8",
                    lift_engine_cap=True, prefix_cache=False if setup.engine == "sglang" else setup.prefix_cache)
    if arch is not None and LINEAR in arch.layer_types:
        tuned = replace(tuned, state_dtype="bf16")
    return tuned


def rank_knobs(setup: Setup, arch: Architecture | None, base: Roofline, samples: int | None, output_mean: float,
               efficiency: float) -> list[Knob]:
    rows = []
    candidates = _knob_setups(setup, arch)
    tuned = _tuned(setup, arch)
    changes = [text for text, changed in (("FP8 weights", tuned.weights != setup.weights), ("FP8 KV", tuned.kv_cache != setup.kv_cache),
                                          ("bf16 state", tuned.state_dtype != setup.state_dtype),
                                          ("no prefix cache", tuned.prefix_cache != setup.prefix_cache)) if changed]
    candidates.append(("all of the above but speculation (tuned)", tuned, True,
                       ", ".join(changes + ["the batch to the memory cap"]) + ": check accuracy first"))
    for name, changed, at_cap, note in candidates:
        try:
            if changed.tp != setup.tp:
                check_tp(arch, changed.tp, changed.gpus)
        except InputError as error:
            rows.append(Knob(knob=name, ceiling_tokens_per_s_per_gpu=0.0, batch=0, days=None, gain=0.0, note=str(error)))
            continue
        result = evaluate(changed, None if at_cap else base.batch)
        gain = result.ceiling_tokens_per_s_per_gpu / base.ceiling_tokens_per_s_per_gpu if base.ceiling_tokens_per_s_per_gpu else 0.0
        if result.max_batch <= 0:
            note = "the weights do not fit this configuration"
        if name.startswith("concurrency") and result.batch == base.batch:
            note = "already at the cap: the batch is what memory allows"
        rows.append(Knob(knob=name, ceiling_tokens_per_s_per_gpu=result.ceiling_tokens_per_s_per_gpu, batch=result.batch,
                         days=days(samples, output_mean, result.ceiling_tokens_per_s_per_gpu * efficiency, setup.gpus),
                         gain=gain, note=f"batch {result.batch}: {note}", prefill_share=result.prefill_share))
    return sorted(rows, key=lambda knob: -knob.ceiling_tokens_per_s_per_gpu)


def _fraction(value: Any, flag: str, default: float) -> float:
    if value is None:
        return default
    number = positive(value, flag)
    if number > 1:
        raise InputError(f"{flag} must be in (0, 1], got {value!r}")
    return number


def _output_lengths(config: Any, max_tokens: int | None) -> tuple[float, float | None]:
    """(mean output, mean of squares or None for a fixed length) from --output-mean or --output-lengths."""
    import numpy as np

    from draftsmith.plan.distribution import load_lengths

    if config.output_lengths is not None:
        if config.output_mean is not None:
            raise InputError("give either --output-mean or --output-lengths, not both")
        lengths = load_lengths(config.output_lengths).astype(float)
        if max_tokens is not None:
            lengths = np.minimum(lengths, max_tokens)
        if not np.all(np.isfinite(lengths)) or lengths.mean() <= 0 or lengths.max() > MAX_SEQUENCE_TOKENS:
            raise InputError(f"--output-lengths {config.output_lengths}: the lengths must be finite, at most "
                             f"{MAX_SEQUENCE_TOKENS:,} tokens, with a positive mean")
        return float(lengths.mean()), float((lengths**2).mean())
    if config.output_mean is None:
        raise InputError("plan engine needs --output-mean TOKENS or --output-lengths FILE:FIELD")
    mean = tokens(config.output_mean, "--output-mean")
    if max_tokens is not None and mean > max_tokens:
        raise InputError(f"--output-mean {mean:g} is above --max-tokens {max_tokens}: an average cannot exceed the cap")
    return mean, None


def _speculation(config: Any, arch: Architecture | None) -> tuple[str, int, float]:
    speculative = config.speculative or "none"
    draft_tokens = positive(config.draft_tokens, "--draft-tokens", integer=True) if config.draft_tokens is not None else 3
    acceptance = 1.0
    if config.acceptance is not None:
        acceptance = positive(config.acceptance, "--acceptance")
        if acceptance < 1:
            raise InputError(f"--acceptance {config.acceptance!r} is below 1: a verify step always keeps its bonus token")
        if acceptance > draft_tokens + 1:
            raise InputError(f"--acceptance {config.acceptance!r} is above --draft-tokens {draft_tokens} + 1: a verify step "
                             f"accepts at most the drafts and one bonus token")
    elif speculative != "none":
        raise InputError(f"--speculative {speculative} needs --acceptance (tokens accepted per verify step, the bonus "
                         f"token included; SGLang's sglang:spec_accept_length)")
    if speculative == "mtp" and arch is not None and not arch.mtp_layers:
        raise InputError(f"--speculative mtp: {arch.source} has no MTP layers (mtp_num_hidden_layers); use --speculative drafter")
    if speculative != "none" and arch is None:
        raise InputError(f"--speculative {speculative} needs --model-config (the drafter's size comes from it)")
    return speculative, draft_tokens, acceptance


def build_setup(config: Any) -> tuple[Setup, dict[str, Any]]:
    """The deployment described by an `EnginePlanConfig`, and the job figures (samples, lengths, measured rate)."""
    params = positive(config.params, "--params") if config.params is not None else None
    kv_override = positive(config.kv_bytes_per_token, "--kv-bytes-per-token") if config.kv_bytes_per_token is not None else None
    state_override = parse_count(config.state_bytes, "--state-bytes") if config.state_bytes is not None else None
    arch = load_architecture(config.model_config_path, params, kv_override, state_override)
    gpu = resolve_gpu(config.gpu, config.gpu_bandwidth, config.gpu_memory, config.gpu_tflops)
    gpus = positive(config.gpus, "--gpus", integer=True) if config.gpus is not None else 1
    tp = positive(config.tp, "--tp", integer=True) if config.tp is not None else 1
    check_tp(arch, tp, gpus)
    max_tokens = tokens(config.max_tokens, "--max-tokens", integer=True) if config.max_tokens is not None else None
    output_mean, output_square = _output_lengths(config, max_tokens)
    prompt_mean = tokens(config.prompt_mean, "--prompt-mean", allow_zero=True) if config.prompt_mean is not None else 0.0
    speculative, draft_tokens, acceptance = _speculation(config, arch)
    state_dtype = config.state_dtype or ("bf16" if arch is not None and arch.ssm_state_dtype in ("bfloat16", "bf16") else "fp32")
    engine = config.engine or "ideal"
    copies = positive(config.state_copies, "--state-copies", integer=True) if config.state_copies is not None else None
    setup = Setup(
        arch=arch, gpu=gpu, gpus=gpus, tp=tp, weights=config.weights or "bf16", kv_cache=config.kv_cache or "auto",
        state_dtype=state_dtype, engine=engine, prefix_cache=True if config.prefix_cache is None else config.prefix_cache,
        speculative=speculative, draft_tokens=draft_tokens, acceptance=acceptance,
        memory_utilization=_fraction(config.memory_utilization, "--memory-utilization", DEFAULT_MEMORY_UTILIZATION),
        context=mean_live_context(prompt_mean, output_mean, output_square), prompt=prompt_mean, output=output_mean,
        params_override=params,
        kv_override=kv_override, state_override=state_override, state_copies_override=copies,
    )
    if arch is None and params is None:
        raise InputError("plan engine needs --params when --model-config is not given")
    concurrency = None
    if config.concurrency is not None and str(config.concurrency).strip().lower() != "auto":
        concurrency = positive(config.concurrency, "--concurrency", integer=True)
    samples = positive(config.samples, "--samples", integer=True) if config.samples is not None else None
    job = {"output_mean": output_mean, "prompt_mean": prompt_mean, "concurrency": concurrency, "samples": samples,
           "efficiency": _fraction(config.efficiency, "--efficiency", DEFAULT_EFFICIENCY), "max_tokens": max_tokens,
           "prompt_given": config.prompt_mean is not None}
    return setup, job


def _measured(config: Any) -> tuple[float | None, str | None, Any]:
    from draftsmith.plan.bench_result import load_bench

    if config.per_gpu is not None and config.bench is not None:
        raise InputError("give either --per-gpu or --bench, not both")
    if config.per_gpu is not None:
        rate = parse_rate(config.per_gpu, "--per-gpu")
        if rate.tokens_per_s <= 0:
            raise InputError(f"--per-gpu {config.per_gpu!r} must be greater than zero")
        return rate.tokens_per_s, f"--per-gpu {config.per_gpu}", None
    if config.bench is not None:
        bench = load_bench(config.bench)
        return bench.knee_output_tokens_per_s, f"bench knee ({config.bench}, concurrency {bench.knee_concurrency})", bench
    return None, None, None


def bench_context(setup: Setup, job: dict[str, Any], bench: Any) -> tuple[dict[str, Any] | None, str | None]:
    """How the job's longer (or shorter) outputs change the batch that fits and the ceiling, against the
    lengths a bench measured at: a 1,024-token bench is no 2,500-token job."""
    measured = bench.knee_mean_output_tokens or bench.max_tokens
    if not measured or abs(measured - job["output_mean"]) <= 0.1 * job["output_mean"]:
        return None, None
    at_bench = replace(setup, context=mean_live_context(job["prompt_mean"], measured), output=measured)
    bench_roofline = evaluate(at_bench, bench.knee_concurrency)
    job_roofline = evaluate(setup, bench.knee_concurrency)
    info = {
        "bench_output_mean": measured, "job_output_mean": job["output_mean"],
        "bench_mean_context": at_bench.context, "job_mean_context": setup.context,
        "bench_concurrency": bench.knee_concurrency,
        "max_batch_at_bench": bench_roofline.max_batch, "max_batch_at_job": job_roofline.max_batch,
        "ceiling_at_bench": bench_roofline.ceiling_tokens_per_s_per_gpu, "ceiling_at_job": job_roofline.ceiling_tokens_per_s_per_gpu,
    }
    ratio = info["ceiling_at_job"] / info["ceiling_at_bench"] if info["ceiling_at_bench"] else 0.0
    line = (f"the bench measured {measured:,.0f}-token outputs but this job's average {job['output_mean']:,.0f}: the mean live "
            f"context goes from {at_bench.context:,.0f} to {setup.context:,.0f} tokens, the batch that fits from "
            f"{bench_roofline.max_batch:,} to {job_roofline.max_batch:,}, and the ceiling at concurrency "
            f"{bench.knee_concurrency} from {info['ceiling_at_bench']:,.0f} to {info['ceiling_at_job']:,.0f} tok/s per GPU "
            f"(x{ratio:.2f}); expect the measured rate to move with it")
    info["ratio"] = ratio
    return info, line


# The settings `make_engine_plan` reads (the fields of plan.config.EnginePlanConfig; a test keeps them equal).
ENGINE_SETTINGS = (
    "model_config_path", "gpu", "gpu_bandwidth", "gpu_memory", "gpu_tflops", "gpus", "tp", "weights", "kv_cache",
    "state_dtype", "concurrency", "prompt_mean", "output_mean", "output_lengths", "max_tokens", "speculative",
    "draft_tokens", "acceptance", "engine", "prefix_cache", "state_copies", "memory_utilization", "efficiency",
    "per_gpu", "bench", "samples", "params", "kv_bytes_per_token", "state_bytes",
)


def engine_settings(**values: Any) -> SimpleNamespace:
    """Settings for `make_engine_plan` from another plan (`plan --gpu`), unnamed ones not given."""
    unknown = set(values) - set(ENGINE_SETTINGS)
    if unknown:
        raise TypeError(f"not plan engine settings: {sorted(unknown)}")
    return SimpleNamespace(**{name: values.get(name) for name in ENGINE_SETTINGS})


def make_engine_plan(config: Any) -> EnginePlan:
    """The ceiling, the measured share and the ranked knobs of an `EnginePlanConfig`. Raises `InputError`."""
    setup, job = build_setup(config)
    measured, source, bench = _measured(config)
    warnings: list[str] = list(setup.arch.warnings) if setup.arch is not None else []
    requested = job["concurrency"]
    if requested is None and bench is not None:
        requested = bench.knee_concurrency
    base = evaluate(setup, requested)
    if base.max_batch <= 0:
        raise InputError(f"the weights ({base.resident_weight_bytes / 1e9:,.1f} GB per GPU) leave no room for a single "
                         f"sequence on {setup.gpu.title} at --memory-utilization {setup.memory_utilization:g}: "
                         f"raise --tp, use --weights fp8, or a larger GPU")
    if requested is not None and requested > base.max_batch:
        why = ("the engine's default cap" if base.engine_cap is not None and base.engine_cap < base.memory_max_batch
               else "the memory")
        warnings.append(f"--concurrency {requested} is more than fits ({base.max_batch}, by {why}); the ceiling is at "
                        f"batch {base.batch}: the engine runs fewer than you send")
    if not job["prompt_given"]:
        warnings.append("no --prompt-mean: the live context counts output tokens only")
    info = None
    if bench is not None:
        info, line = bench_context(setup, job, bench)
        if line:
            warnings.append(line)
    share = measured / base.ceiling_tokens_per_s_per_gpu if measured and base.ceiling_tokens_per_s_per_gpu else None
    efficiency, samples, output_mean = job["efficiency"], job["samples"], job["output_mean"]
    arch = setup.arch
    return EnginePlan(
        model=arch.source if arch else f"--params {setup.params_override:,.0f}",
        gpu=setup.gpu.title, gpus=setup.gpus, tp=setup.tp, engine=setup.engine, weights=setup.weights,
        kv_cache=setup.kv_cache, state_dtype=setup.state_dtype, speculative=setup.speculative,
        draft_tokens=setup.gamma, acceptance=setup.tau, prompt_mean=job["prompt_mean"], output_mean=output_mean,
        mean_context=setup.context, params=arch.params() if arch else setup.params_override,
        weights_bytes_per_step=base.weights_bytes_per_step, kv_bytes_per_token=base.kv_bytes_per_token,
        state_bytes_per_sequence=base.state_bytes_per_sequence, state_copies=base.state_copies, max_batch=base.max_batch,
        requested_concurrency=requested if requested is not None else "auto", batch=base.batch,
        step_time_s=base.step_time_s, step_time_bandwidth_s=base.step_time_bandwidth_s,
        step_time_compute_s=base.step_time_compute_s, step_time_allreduce_s=base.step_time_allreduce_s, bound=base.bound,
        ceiling_tokens_per_s_per_gpu=base.ceiling_tokens_per_s_per_gpu, efficiency=efficiency,
        prefill_tokens_per_step=base.prefill_tokens_per_step, prefill_share=base.prefill_share,
        measured_tokens_per_s_per_gpu=measured, measured_source=source, measured_share=share, samples=samples,
        days_at_ceiling=days(samples, output_mean, base.ceiling_tokens_per_s_per_gpu, setup.gpus),
        days_at_efficiency=days(samples, output_mean, base.ceiling_tokens_per_s_per_gpu * efficiency, setup.gpus),
        days_at_measured=days(samples, output_mean, measured, setup.gpus) if measured else None,
        knobs=rank_knobs(setup, arch, base, samples, output_mean, efficiency),
        bench_context=info, warnings=warnings,
    )
