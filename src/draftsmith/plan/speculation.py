"""`draftsmith plan speculation`: how many draft tokens (K, vLLM's num_speculative_tokens) at which
concurrency, from a measured per-position acceptance profile, the target's and the drafter's sizes
and a device.

The profile a_k is the share of verify steps whose draft position k was accepted (k = 1..block-1);
it never rises with k, since a position counts only when every earlier one was accepted too. With K
drafts per step the tokens committed per step are

    tau(K) = 1 + a_1 + ... + a_K                      (the bonus token, then each accepted draft)

assuming the first K positions are accepted as often when fewer are drafted (a DFlash block sees
itself bidirectionally, so a shorter block can draft its first positions a little differently).

One decode step at batch B (all running requests advance together):

    T(K) = T_verify(B, K) + T_draft(B, K) + overhead
    output tok/s = B * tau(K) / T(K)

- T_verify: the target's forward over B*(K+1) tokens, from `plan engine`'s roofline (plan/engine.py
  `evaluate`: weight, KV and state bytes over the bandwidth against FLOPs over the peak, whichever
  is longer; its memory cap and the engine's default cap hold the batch).
- T_draft: the drafter's own forward, priced the same way from its exported config (a variant's
  `DrafterCost`; DFlash: one parallel forward over the block [bonus, MASK x K] of every request:
  its layers and the target's LM head read once, its KV over the live context, the target features
  of the tau newly committed tokens through `fc` and each layer's K/V projections).
- overhead: the engine's cost per step that no roofline sees (scheduling, Python, sampling,
  kernel launches), the device entry's `step_overhead_s + B * request_overhead_s` (0 for catalogue
  GPUs, measured against an engine on a CPU, where it dominates small models;
  benchmarks/bench_speculation.py); a speculative step (drafter or n-gram) adds
  `draft_step_overhead_s + B * draft_request_overhead_s` (the drafter's forward launch, the
  proposer's and rejection sampler's bookkeeping: large on vLLM CPU, hidden on a GPU); the drafter's
  step adds `B * K * draft_token_overhead_s` more (its forward's cost per drafted token beyond the
  roofline: on vLLM CPU it grows with B*K where n-gram's does not).
- no speculation: B / (T_verify(B, 0) + overhead); n-gram (prompt lookup): no drafter forward, its
  own profile (`eval --baseline ngram` measures one), T = T_verify(B, K) + overhead.

The numbers are ceilings (a real engine reaches 0.6-0.8 of the roofline on a GPU, see plan engine);
the best K compares like with like, so it holds as long as the shortfall is about the same for each
K. The drafter's memory is not taken from the batch's (a few layers beside the target's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.client.prometheus import parse_samples, vllm_position_counts
from draftsmith.core.config import cli
from draftsmith.core.errors import InputError
from draftsmith.core.limits import MAX_BLOCK_SIZE
from draftsmith.core.readers import BadJSONError, loads_json, read_json, read_regular_bytes
from draftsmith.plan.architecture import FULL, SLIDING, Architecture, read_architecture
from draftsmith.plan.device import parse_seconds
from draftsmith.plan.engine import (
    DEFAULT_MEMORY_UTILIZATION,
    EXTERNAL_DRAFTER,
    KV_BYTES,
    Roofline,
    Setup,
    evaluate,
    mean_live_context,
    positive,
    resolve_gpu,
    tokens,
)
from draftsmith.plan.gpus import GpuSpec

DEFAULT_CONCURRENCY = (1, 8, 32, 128)
BF16_BYTES = 2.0
# Profiles from counts (vLLM's, bench's) are exact shares; rounded shares in JSON may wobble this much.
MONOTONE_TOLERANCE = 1e-6
# The most draft positions a profile may name: those of the largest block anything drafts. A file
# naming more (or a scrape naming position 99999999) is refused before a list that long is built;
# positions past the drafter's own block are read and ignored, with a warning.
MAX_POSITIONS = MAX_BLOCK_SIZE - 1
# An acceptance file is a report or a /metrics scrape: a few kB to a few MB.
MAX_PROFILE_BYTES = 16 * 2**20


class SpeculationPlanConfig(BaseModel):
    """`draftsmith plan speculation`: the best number of draft tokens per concurrency, from a measured
    per-position acceptance profile, beside no speculation and n-gram."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_config_path: Annotated[str | None, cli("--model-config", metavar="PATH")] = Field(
        None, description="the target's config.json or model directory")
    drafter: Annotated[str | None, cli(metavar="EXPORT_DIR")] = Field(
        None, description="the exported drafter (`draftsmith export --out`): its config prices its forward")
    gpu: Annotated[str | None, cli(metavar="NAME|FILE")] = Field(
        None, description="a catalogue GPU (h100, ...) or a device file from `plan device --measure`")
    acceptance_from: Annotated[str | None, cli(metavar="FILE")] = Field(
        None, description="per-position acceptance from an `eval --json` output, a `check` report, a vLLM /metrics "
                          "scrape or a `bench` JSON")
    acceptance: Annotated[str | None, cli(metavar="A1,A2,...")] = Field(
        None, description="per-position acceptance given directly: share of steps accepting draft 1, 2, ...")
    ngram_from: Annotated[str | None, cli(metavar="FILE")] = Field(
        None, description="n-gram acceptance profile (`eval --baseline ngram --json`, a vLLM n-gram /metrics scrape "
                          "or bench JSON); an eval file given to --acceptance-from is read for it too")
    ngram_acceptance: Annotated[str | None, cli(metavar="A1,A2,...")] = Field(
        None, description="n-gram per-position acceptance given directly")
    concurrency: Annotated[str | None, cli(metavar="N,N,...")] = Field(
        None, description="requests in flight to plan for (1,8,32,128)")
    draft_tokens: Annotated[str | None, cli(metavar="K,K,...")] = Field(
        None, description="draft tokens per step to compare (1..block-1)")
    prompt_mean: Annotated[str | None, cli(metavar="TOKENS")] = Field(None, description="average prompt tokens (0)")
    output_mean: Annotated[str | None, cli(metavar="TOKENS")] = Field(None, description="average output tokens")
    weights: Annotated[Literal["bf16", "fp8", "fp4", "int4", "fp32"] | None, cli(metavar="DTYPE")] = Field(
        None, description="target weight dtype: bf16, fp8, fp4, int4, fp32 (vLLM CPU --dtype float32) (bf16)")
    engine: Annotated[Literal["ideal", "sglang", "vllm"] | None, cli(metavar="NAME")] = Field(
        None, description="whose state copies and default caps: ideal, sglang, vllm (vllm)")
    memory_utilization: Annotated[str | None, cli(metavar="FRACTION")] = Field(
        None, description="share of device memory the engine may use (0.9)")
    step_overhead: Annotated[str | None, cli(metavar="DURATION")] = Field(
        None, description="the engine's fixed cost per step ('1.6ms'), instead of the device entry's")


# ---------------------------------------------------------------------------------------------------
# Acceptance profiles


class Profile(BaseModel):
    """Per-position acceptance: `per_position[k-1]` = share of verify steps accepting draft position k."""

    source: str
    per_position: list[float]
    steps: int | None = None  # verify steps behind it, when counted

    def tau(self, k: int) -> float:
        return 1.0 + sum(self.per_position[:k])


def check_profile(values: list[float], source: str) -> list[float]:
    """`values` when they are a per-position profile: not empty, at most `MAX_POSITIONS` long, each in
    [0, 1], never rising."""
    if not values:
        raise InputError(f"{source}: the acceptance profile is empty (no draft position measured)")
    if len(values) > MAX_POSITIONS:
        raise InputError(f"{source}: {len(values):,} draft positions; no draft block has more than {MAX_POSITIONS}")
    for position, value in enumerate(values, start=1):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"{source}: position {position}: acceptance {value!r} is not a number")
        if not 0.0 <= value <= 1.0:
            raise InputError(f"{source}: position {position}: acceptance {value:g} is outside [0, 1] (a share of "
                             f"verify steps)")
        if position > 1 and value > values[position - 2] + MONOTONE_TOLERANCE:
            raise InputError(f"{source}: position {position}: acceptance {value:g} is above position {position - 1}'s "
                             f"{values[position - 2]:g}; a per-position profile never rises (a draft counts only when "
                             f"every earlier one was accepted)")
    return [float(value) for value in values]


def parse_profile(text: str, flag: str) -> Profile:
    values = []
    parts = [part.strip() for part in str(text).split(",")] if str(text).replace(",", "").strip() else []
    if len(parts) > MAX_POSITIONS:
        raise InputError(f"{flag}: {len(parts):,} positions; no draft block has more than {MAX_POSITIONS}")
    for index, part in enumerate(parts, start=1):
        if not part:  # skipping it would move every later share to the position before its own
            raise InputError(f"{flag} {text!r}: position {index} is empty (two commas in a row?)")
        try:
            values.append(float(part))
        except ValueError:
            raise InputError(f"{flag} {text!r}: {part!r} is not a number") from None
    return Profile(source=flag, per_position=check_profile(values, flag))


def _from_counts(drafts: float, accepted: list[float], source: str) -> Profile:
    if drafts <= 0:
        raise InputError(f"{source}: no verify steps counted (did the engine speculate?)")
    return Profile(source=source, per_position=check_profile([count / drafts for count in accepted], source),
                   steps=int(round(drafts)))


def _eval_profiles(data: dict, source: str) -> dict[str, Profile]:
    """method -> profile of an `eval --json` report (the drafter's and each baseline's)."""
    profiles = {}
    for report in [data, *(data.get("baselines") or [])]:
        if not isinstance(report, dict):
            continue
        method = str(report.get("method") or "dflash")
        values = report.get("per_position_acceptance")
        if not isinstance(values, list):
            raise InputError(f"{source}: method {method}: missing field 'per_position_acceptance'")
        where = f"{source} ({method})"
        profiles[method] = Profile(source=where, per_position=check_profile(values, where),
                                   steps=report.get("total_cycles") if isinstance(report.get("total_cycles"), int) else None)
    return profiles


def _check_profile_of(data: dict, source: str) -> Profile:
    overfit = data.get("overfit") or {}
    counts = overfit.get("engine_acceptance") if isinstance(overfit, dict) else None
    if not isinstance(counts, dict) or not counts:
        raise InputError(f"{source}: this check report has no engine acceptance (run `draftsmith check --overfit "
                         f"--endpoint URL` to measure one)")
    drafts, accepted = 0.0, []
    for prompt, row in counts.items():
        if not isinstance(row, list) or not row or not all(isinstance(x, (int, float)) for x in row):
            raise InputError(f"{source}: overfit.engine_acceptance[{prompt!r}] is not [steps, accepted per position...]")
        drafts += row[0]
        accepted += [0.0] * (len(row) - 1 - len(accepted))
        for k, count in enumerate(row[1:]):
            accepted[k] += count
    return _from_counts(drafts, accepted, source)


def _bench_profile(data: dict, source: str) -> Profile:
    """Summed over the levels of a `bench` result that recorded vLLM's per-position counters."""
    drafts, accepted = 0.0, []
    for row in data.get("results") or []:
        metrics = row.get("engine_metrics") if isinstance(row, dict) else None
        if not isinstance(metrics, dict) or not isinstance(metrics.get("spec_accepted_per_position"), list):
            continue
        counts = metrics["spec_accepted_per_position"]
        drafts += float(metrics.get("spec_drafts") or 0)
        accepted += [0.0] * (len(counts) - len(accepted))
        for k, count in enumerate(counts):
            accepted[k] += float(count)
    if not accepted:
        raise InputError(f"{source}: no level of this bench recorded per-position acceptance (bench a vLLM endpoint "
                         f"that speculates; /metrics must be reachable)")
    return _from_counts(drafts, accepted, source)


def read_profiles(path: str | Path, flag: str) -> dict[str, Profile]:
    """method -> profile from a file: "drafter" (or an eval report's method names, "ngram" among them)."""
    path = Path(path)
    source = f"{flag} {path}"
    try:  # the shared reader: a plain file (a FIFO or a link to /dev/zero is refused), of bounded size
        raw = read_regular_bytes(path, MAX_PROFILE_BYTES)
    except FileNotFoundError:
        raise InputError(f"{source}: no such file") from None
    except InputError as error:
        raise InputError(f"{flag} {error}") from None
    if raw.lstrip()[:1] in (b"{", b"["):
        try:
            data = loads_json(raw, source)  # its depth bounded too
        except BadJSONError as error:
            raise InputError(str(error)) from None
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(f"{source}: not UTF-8 text (byte {error.start})") from None
        try:
            counts = vllm_position_counts(parse_samples(text), max_positions=MAX_POSITIONS)
        except InputError as error:
            raise InputError(f"{source}: {error}") from None
        if counts is None:
            raise InputError(f"{source}: neither JSON nor a vLLM /metrics scrape with "
                             f"vllm:spec_decode_num_accepted_tokens_per_pos")
        return {"drafter": _from_counts(counts.drafts, counts.accepted_per_position, source)}
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "draftsmith.eval":
        return _eval_profiles(data, source)
    if kind == "draftsmith.eval.endpoint":
        values = data.get("per_position_acceptance")
        if not isinstance(values, list):
            raise InputError(f"{source}: missing field 'per_position_acceptance'")
        return {"drafter": Profile(source=source, per_position=check_profile(values, source),
                                   steps=data.get("num_drafts") if isinstance(data.get("num_drafts"), int) else None)}
    if kind == "draftsmith.check":
        return {"drafter": _check_profile_of(data, source)}
    if kind == "draftsmith.bench":
        return {"drafter": _bench_profile(data, source)}
    raise InputError(f"{source}: field 'kind' is {kind!r}; expected an `eval --json` output (draftsmith.eval, "
                     f"draftsmith.eval.endpoint), a `check` report (draftsmith.check), a `bench` JSON (draftsmith.bench) "
                     f"or a vLLM /metrics scrape")


def _pick(profiles: dict[str, Profile], wanted: tuple[str, ...]) -> Profile | None:
    return next((profiles[name] for name in wanted if name in profiles), None)


# ---------------------------------------------------------------------------------------------------
# The drafter's forward


@dataclass(frozen=True)
class StepCost:
    bytes: float
    flops: float


class DrafterCost(Protocol):
    """What one drafting forward of a variant reads and computes; a variant registers a factory in
    `DRAFTER_VARIANTS` under its config's `architectures` name."""

    variant: str
    block_size: int

    def step(self, batch: int, draft_tokens: int, tau: float, context: float, head_params: float,
             kv_bytes: float) -> StepCost:
        """One step at `batch` requests drafting `draft_tokens` each, `tau` tokens committed per request
        by the last verify, `context` live tokens, a `head_params` LM head, `kv_bytes` per KV element."""
        ...


@dataclass(frozen=True)
class DFlashCost:
    """DFlash: one parallel forward over [bonus, MASK x K] per request (DFLASH.md; vLLM qwen3_dflash.py),
    whose layers attend to the fused target features of the context (KV injection)."""

    arch: Architecture  # its decoder layers (no embedding or LM head of its own)
    block_size: int
    feature_width: int  # k target layers x target hidden: the fc input per context token
    variant: str = "dflash"

    def layer_params(self) -> float:
        return sum(t.params for t in self.arch.tensors if t.role in ("gemm", "vector") and not t.mtp
                   and t.name != "final_norm")

    def context_params(self) -> float:
        """Per committed token: fc over its target features, then each layer's K and V projections."""
        kv = sum(t.params for t in self.arch.tensors if t.name in ("k_proj", "v_proj"))
        return self.feature_width * self.arch.hidden_size + kv

    def resident_params(self) -> float:
        return self.layer_params() + self.feature_width * self.arch.hidden_size

    def step(self, batch: int, draft_tokens: int, tau: float, context: float, head_params: float,
             kv_bytes: float) -> StepCost:
        arch, query = self.arch, draft_tokens + 1
        window = min(context, arch.sliding_window) if arch.sliding_window else context
        kv_read = batch * (context * arch.kv_elements_per_token() + window * arch.kv_elements_per_token(True)) * kv_bytes
        features = batch * tau * self.feature_width * BF16_BYTES
        weights = (self.resident_params() + head_params) * BF16_BYTES
        flops = (batch * query * (2 * self.layer_params() + arch.attention_flops_per_token(context + query))
                 + batch * tau * 2 * self.context_params()
                 + batch * draft_tokens * 2 * head_params)
        return StepCost(bytes=weights + kv_read + features, flops=flops)


def _dflash(path: Path, config: dict) -> DFlashCost:
    arch = read_architecture(path)
    flash = config.get("dflash_config") or {}
    layers = flash.get("target_layer_ids") or config.get("target_layer_ids")
    if not isinstance(layers, list) or not layers:
        raise InputError(f"{path}: dflash_config.target_layer_ids is missing: not a DFlash export")
    block = config.get("block_size")
    if isinstance(block, bool) or not isinstance(block, int) or block < 2:
        raise InputError(f"{path}: block_size must be an integer of at least 2, got {block!r}")
    width = int(config.get("target_hidden_size") or arch.hidden_size) * len(layers)
    return DFlashCost(arch=arch, block_size=block, feature_width=width)


@dataclass(frozen=True)
class DSparkCost(DFlashCost):
    """DSpark: DFlash's forward over [anchor, MASK x (K-1)] (K queries draft K tokens: every position,
    the anchor's included, predicts), plus per drafted token the Markov bias markov_w2(markov_w1[prev])
    (r x V) and the confidence head (vLLM qwen3_dspark.py)."""

    markov_rank: int = 0
    draft_vocab: int = 0
    confidence_inputs: int = 0  # hidden (+ r with the Markov embedding); 0 without a confidence head
    variant: str = "dspark"

    @property
    def draft_positions(self) -> int:
        return self.block_size

    def step(self, batch: int, draft_tokens: int, tau: float, context: float, head_params: float,
             kv_bytes: float) -> StepCost:
        base = DFlashCost.step(self, batch, max(draft_tokens - 1, 0), tau, context, head_params, kv_bytes)
        heads = self.markov_rank * self.draft_vocab + self.confidence_inputs  # markov_w2 and the confidence proj
        per_token = 2 * head_params + 2 * heads + 2 * self.markov_rank  # the anchor's logits too; w1 is a lookup
        extra_flops = batch * draft_tokens * per_token - batch * max(draft_tokens - 1, 0) * 2 * head_params
        lookups = batch * draft_tokens * self.markov_rank * BF16_BYTES
        return StepCost(bytes=base.bytes + heads * BF16_BYTES + lookups, flops=base.flops + extra_flops)


def _dspark(path: Path, config: dict) -> DSparkCost:
    dflash = _dflash(path, config)
    rank = config.get("markov_rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InputError(f"{path}: markov_rank must be a positive integer in a {config.get('architectures')} export, "
                         f"got {rank!r}")
    vocab = config.get("draft_vocab_size") or config.get("vocab_size") or dflash.arch.vocab_size
    confidence = (dflash.arch.hidden_size + (rank if config.get("confidence_head_with_markov") else 0)
                  if config.get("enable_confidence_head") else 0)
    return DSparkCost(arch=dflash.arch, block_size=dflash.block_size, feature_width=dflash.feature_width,
                      markov_rank=rank, draft_vocab=int(vocab), confidence_inputs=confidence)


DRAFTER_VARIANTS: dict[str, Callable[[Path, dict], DrafterCost]] = {"DFlashDraftModel": _dflash,
                                                                   "Qwen3DSparkModel": _dspark}


def draft_positions(drafter: DrafterCost) -> int:
    """Tokens a drafter's block drafts per step: B-1 for DFlash (the anchor is the target's), B for DSpark."""
    return int(getattr(drafter, "draft_positions", drafter.block_size - 1))


def check_drafter_for_target(export_dir: str | Path, model_config: str | Path, arch: Architecture) -> None:
    """The drafter was made for this target: its width and vocabulary are the target's, its layer ids are
    inside the target, and the target architectures it records include the target's. A drafter priced
    against another model's config is priced wrong by orders of magnitude (a 128-wide one on an 8B)."""
    from draftsmith.model.shape import read_model_config

    path = Path(export_dir)
    config = read_json(path / "config.json" if path.is_dir() else path, "drafter config.json")
    if not isinstance(config, dict):
        raise InputError(f"{path}: the drafter's config.json is not a JSON object")
    _, target = read_model_config(model_config)
    flash = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    problems = []
    width = config.get("target_hidden_size") or config.get("hidden_size")
    if width != arch.hidden_size:
        problems.append(f"hidden size {width} (the target's is {arch.hidden_size})")
    if config.get("vocab_size") != arch.vocab_size:
        problems.append(f"vocab_size {config.get('vocab_size')} (the target's is {arch.vocab_size})")
    layers = flash.get("target_layer_ids") or config.get("target_layer_ids") or []
    if isinstance(layers, list) and any(isinstance(i, int) and i >= arch.num_layers for i in layers):
        problems.append(f"target_layer_ids {layers} (the target has {arch.num_layers} layers)")
    recorded = flash.get("target_architectures")
    theirs = target.get("architectures")
    theirs = [theirs] if isinstance(theirs, str) else theirs
    if isinstance(recorded, list) and recorded and isinstance(theirs, list) and theirs \
            and not set(map(str, recorded)) & set(map(str, theirs)):
        problems.append(f"target_architectures {recorded} (the target is {theirs})")
    if problems:
        raise InputError(f"--drafter {export_dir}: made for another target than --model-config {model_config}: "
                         f"{'; '.join(problems)}; give the drafter trained for this target")


def read_drafter(export_dir: str | Path) -> DrafterCost:
    """The drafter's cost model from its exported config.json, by its `architectures` name."""
    path = Path(export_dir)
    config_path = path / "config.json" if path.is_dir() else path
    try:
        config = read_json(config_path, "config.json", missing_ok=True)
    except InputError as error:
        raise InputError(f"--drafter {error}") from None
    if config is None:
        raise InputError(f"--drafter {export_dir}: no config.json there (give `draftsmith export --out`'s directory)")
    names = config.get("architectures") if isinstance(config, dict) else None
    for name in names or []:
        if name in DRAFTER_VARIANTS:
            return DRAFTER_VARIANTS[name](config_path, config)
    raise InputError(f"--drafter {config_path}: architectures {names!r} is no drafter this plans "
                     f"(known: {', '.join(DRAFTER_VARIANTS)})")


# ---------------------------------------------------------------------------------------------------
# The plan


class Option(BaseModel):
    """One way to decode at one concurrency: no speculation, the drafter at K, n-gram at K."""

    method: str  # "none", the drafter's variant, "ngram"
    draft_tokens: int
    tau: float
    target_step_s: float
    target_bound: str
    drafter_step_s: float = 0.0
    drafter_bound: str | None = None
    overhead_s: float = 0.0
    step_time_s: float
    tokens_per_s: float
    speedup: float  # over no speculation at the same concurrency


class ConcurrencyPlan(BaseModel):
    concurrency: int
    batch: int  # what runs: the concurrency, or what memory and the engine's cap allow
    no_speculation: Option
    drafter: list[Option]
    best_k: int
    best_tokens_per_s: float
    best_speedup: float
    ngram: list[Option] = Field(default_factory=list)
    ngram_best_k: int | None = None
    ngram_best_tokens_per_s: float | None = None
    recommendation: str


class SpeculationPlan(BaseModel):
    model: str
    drafter: str
    drafter_variant: str
    block_size: int
    device: str
    weights: str
    engine: str
    prompt_mean: float
    output_mean: float
    mean_context: float
    step_overhead_s: float
    acceptance: Profile
    ngram_acceptance: Profile | None = None
    plans: list[ConcurrencyPlan]
    warnings: list[str] = Field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "draftsmith.plan.speculation", "version": 1, **self.model_dump(mode="json")}


def _counts(text: str | None, flag: str, default: tuple[int, ...]) -> list[int]:
    if text is None:
        return list(default)
    values = [positive(part.strip(), flag, integer=True) for part in str(text).split(",") if part.strip()]
    if not values:
        raise InputError(f"{flag} {text!r}: give one or more whole numbers, e.g. 1,8,32")
    return sorted(set(values))


def _device_view(device: GpuSpec, weights: str) -> tuple[GpuSpec, str]:
    """fp32 serving is bf16 arithmetic at twice the bytes: the same roofline on a device with half the
    bandwidth and memory and its fp32 matmul rate as the peak (every byte count in the model is 2 B)."""
    if weights != "fp32":
        return device, weights
    if not device.fp32_flops:
        raise InputError(f"--weights fp32: {device.title} has no fp32 matmul figure; measure the device with "
                         f"`draftsmith plan device --measure` and pass its file as --gpu")
    return device.model_copy(update={"bandwidth_bytes_per_s": device.bandwidth_bytes_per_s / 2,
                                     "memory_bytes": device.memory_bytes // 2, "bf16_flops": device.fp32_flops,
                                     "fp8_flops": None, "fp4_flops": None}), "bf16"


def _roofline_time(cost: StepCost, device: GpuSpec) -> tuple[float, str]:
    bandwidth = cost.bytes / device.bandwidth_bytes_per_s
    compute = cost.flops / device.peak_flops("bf16")
    return max(bandwidth, compute), "bandwidth" if bandwidth >= compute else "compute"


@dataclass(frozen=True)
class _Inputs:
    setup: Setup
    drafter: DrafterCost
    drafter_path: str
    acceptance: Profile
    ngram: Profile | None
    concurrency: list[int]
    draft_tokens: list[int]
    overhead: float
    prompt_mean: float
    output_mean: float
    warnings: tuple[str, ...]


def _profiles(config: SpeculationPlanConfig) -> tuple[Profile, Profile | None]:
    if (config.acceptance_from is None) == (config.acceptance is None):
        raise InputError("plan speculation needs the drafter's per-position acceptance: --acceptance-from FILE or "
                         "--acceptance A1,A2,... (one of them)")
    from_file = read_profiles(config.acceptance_from, "--acceptance-from") if config.acceptance_from else {}
    if config.acceptance is not None:
        acceptance = parse_profile(config.acceptance, "--acceptance")
    else:
        acceptance = _pick(from_file, ("drafter", "dflash", "dspark"))
        if acceptance is None:
            raise InputError(f"--acceptance-from {config.acceptance_from}: no drafter profile in it (methods: "
                             f"{', '.join(from_file)}); give the drafter's eval, or --acceptance")
    if config.ngram_from is not None and config.ngram_acceptance is not None:
        raise InputError("give either --ngram-from or --ngram-acceptance, not both")
    ngram = None
    if config.ngram_acceptance is not None:
        ngram = parse_profile(config.ngram_acceptance, "--ngram-acceptance")
    elif config.ngram_from is not None:
        profiles = read_profiles(config.ngram_from, "--ngram-from")
        ngram = _pick(profiles, ("ngram", "drafter"))
        if ngram is None:
            raise InputError(f"--ngram-from {config.ngram_from}: no n-gram profile in it (methods: {', '.join(profiles)})")
    else:
        ngram = from_file.get("ngram")
    return acceptance, ngram


def build_inputs(config: SpeculationPlanConfig) -> _Inputs:
    if config.model_config_path is None:
        raise InputError("plan speculation needs --model-config (the target's config.json or model directory)")
    if config.drafter is None:
        raise InputError("plan speculation needs --drafter EXPORT_DIR (the exported drafter)")
    if config.gpu is None:
        raise InputError("plan speculation needs --gpu NAME or --gpu FILE (a device from `plan device --measure`)")
    if config.output_mean is None:
        raise InputError("plan speculation needs --output-mean TOKENS (the live context sets the KV read per step)")
    arch = read_architecture(config.model_config_path)
    drafter = read_drafter(config.drafter)
    check_drafter_for_target(config.drafter, config.model_config_path, arch)
    device, weights = _device_view(resolve_gpu(config.gpu), config.weights or "bf16")
    acceptance, ngram = _profiles(config)
    warnings = []
    block_positions = draft_positions(drafter)
    if config.draft_tokens is not None:
        ks = _counts(config.draft_tokens, "--draft-tokens", ())
        beyond = [k for k in ks if k > block_positions]
        if beyond:
            raise InputError(f"--draft-tokens {beyond[0]} is beyond the drafter's block: block_size "
                             f"{drafter.block_size} drafts at most {block_positions} tokens per step")
        short = [k for k in ks if k > len(acceptance.per_position)]
        if short:
            raise InputError(f"--draft-tokens {short[0]}: {acceptance.source} measured only "
                             f"{len(acceptance.per_position)} draft positions; measure at K >= {short[0]}")
    else:
        ks = list(range(1, min(block_positions, len(acceptance.per_position)) + 1))
        if len(acceptance.per_position) < block_positions:
            warnings.append(f"{acceptance.source} measured {len(acceptance.per_position)} draft positions of the "
                            f"block's {block_positions}: K past {len(acceptance.per_position)} is not planned")
    if len(acceptance.per_position) > block_positions:
        warnings.append(f"{acceptance.source} has {len(acceptance.per_position)} positions, more than the drafter's "
                        f"block allows ({block_positions}): positions past {block_positions} are ignored")
    output_mean = tokens(config.output_mean, "--output-mean")  # both at most MAX_SEQUENCE_TOKENS, like plan engine's
    prompt_mean = tokens(config.prompt_mean, "--prompt-mean", allow_zero=True) if config.prompt_mean is not None else 0.0
    utilization = DEFAULT_MEMORY_UTILIZATION
    if config.memory_utilization is not None:
        utilization = positive(config.memory_utilization, "--memory-utilization")
        if utilization > 1:
            raise InputError(f"--memory-utilization must be in (0, 1], got {config.memory_utilization!r}")
    overhead = device.step_overhead_s
    if config.step_overhead is not None:
        overhead = parse_seconds(config.step_overhead, "--step-overhead")
    setup = Setup(
        arch=arch, gpu=device, gpus=1, tp=1, weights=weights, kv_cache="auto",
        state_dtype="bf16" if arch.ssm_state_dtype in ("bfloat16", "bf16") else "fp32", engine=config.engine or "vllm",
        prefix_cache=True, speculative="none", draft_tokens=0, acceptance=1.0, memory_utilization=utilization,
        context=mean_live_context(prompt_mean, output_mean),
    )
    return _Inputs(setup=setup, drafter=drafter, drafter_path=str(config.drafter), acceptance=acceptance, ngram=ngram,
                   concurrency=_counts(config.concurrency, "--concurrency", DEFAULT_CONCURRENCY), draft_tokens=ks,
                   overhead=overhead, prompt_mean=prompt_mean, output_mean=output_mean, warnings=tuple(warnings))


def _head_params(arch: Architecture) -> float:
    return float(arch.vocab_size * arch.hidden_size)


def _option(method: str, k: int, tau: float, target: Roofline, drafter: StepCost | None, device: GpuSpec,
            overhead: float, plain_tokens_per_s: float | None) -> Option:
    drafter_s, drafter_bound = _roofline_time(drafter, device) if drafter is not None else (0.0, None)
    step = target.step_time_s + drafter_s + overhead
    rate = target.batch * tau / step if target.batch > 0 else 0.0
    return Option(method=method, draft_tokens=k, tau=tau, target_step_s=target.step_time_s, target_bound=target.bound,
                  drafter_step_s=drafter_s, drafter_bound=drafter_bound, overhead_s=overhead, step_time_s=step,
                  tokens_per_s=rate, speedup=rate / plain_tokens_per_s if plain_tokens_per_s else 1.0)


def _verify(setup: Setup, concurrency: int, k: int, tau: float) -> Roofline:
    if k == 0:
        return evaluate(setup, concurrency)
    return evaluate(replace(setup, speculative=EXTERNAL_DRAFTER, draft_tokens=k, acceptance=tau), concurrency)


def plan_concurrency(inputs: _Inputs, concurrency: int) -> ConcurrencyPlan:
    setup, device, overhead = inputs.setup, inputs.setup.gpu, inputs.overhead
    plain_target = _verify(setup, concurrency, 0, 1.0)
    if plain_target.max_batch <= 0:
        raise InputError(f"the target's weights leave no room for a single sequence on {device.title}")
    plain_overhead = overhead + plain_target.batch * device.request_overhead_s
    plain = _option("none", 0, 1.0, plain_target, None, device, plain_overhead, None)

    def engine_overhead(batch: int) -> float:  # what a speculative step at this batch pays beside its rooflines
        return (overhead + batch * device.request_overhead_s + device.draft_step_overhead_s
                + batch * device.draft_request_overhead_s)

    kv_bytes = KV_BYTES[setup.kv_cache]
    head = _head_params(setup.arch)
    rows = []
    for k in inputs.draft_tokens:
        tau = inputs.acceptance.tau(k)
        target = _verify(setup, concurrency, k, tau)
        cost = inputs.drafter.step(target.batch, k, tau, setup.context, head, kv_bytes)
        drafter_overhead = engine_overhead(target.batch) + target.batch * k * device.draft_token_overhead_s
        rows.append(_option(inputs.drafter.variant, k, tau, target, cost, device, drafter_overhead, plain.tokens_per_s))
    best = max(rows, key=lambda option: option.tokens_per_s)
    ngram_rows = []
    if inputs.ngram is not None:
        for k in range(1, len(inputs.ngram.per_position) + 1):
            tau = inputs.ngram.tau(k)
            verify = _verify(setup, concurrency, k, tau)
            ngram_rows.append(_option("ngram", k, tau, verify, None, device, engine_overhead(verify.batch),
                                      plain.tokens_per_s))
    ngram_best = max(ngram_rows, key=lambda option: option.tokens_per_s) if ngram_rows else None
    if best.tokens_per_s <= plain.tokens_per_s:
        advice = (f"no speculation: at batch {plain_target.batch} the drafter's best (K={best.draft_tokens}, "
                  f"{best.speedup:.2f}x) does not pay for its verify and draft work")
    else:
        advice = f"K={best.draft_tokens} ({best.speedup:.2f}x over no speculation, tau {best.tau:.2f})"
    if ngram_best is not None and ngram_best.tokens_per_s > max(best.tokens_per_s, plain.tokens_per_s):
        advice += f"; n-gram at K={ngram_best.draft_tokens} is faster still ({ngram_best.speedup:.2f}x)"
    return ConcurrencyPlan(
        concurrency=concurrency, batch=plain_target.batch, no_speculation=plain, drafter=rows, best_k=best.draft_tokens,
        best_tokens_per_s=best.tokens_per_s, best_speedup=best.speedup, ngram=ngram_rows,
        ngram_best_k=ngram_best.draft_tokens if ngram_best else None,
        ngram_best_tokens_per_s=ngram_best.tokens_per_s if ngram_best else None, recommendation=advice,
    )


def make_speculation_plan(config: SpeculationPlanConfig) -> SpeculationPlan:
    """The per-concurrency table and best K of a `SpeculationPlanConfig`. Raises `InputError`."""
    inputs = build_inputs(config)
    plans = [plan_concurrency(inputs, concurrency) for concurrency in inputs.concurrency]
    warnings = list(inputs.warnings)
    for plan in plans:
        if plan.batch < plan.concurrency:
            warnings.append(f"concurrency {plan.concurrency}: only {plan.batch} requests fit (memory or the engine's "
                            f"cap); planned at batch {plan.batch}")
    if not config.prompt_mean:
        warnings.append("no --prompt-mean: the live context counts output tokens only")
    setup = inputs.setup
    return SpeculationPlan(
        model=setup.arch.source, drafter=inputs.drafter_path, drafter_variant=inputs.drafter.variant,
        block_size=inputs.drafter.block_size, device=setup.gpu.title, weights=config.weights or "bf16",
        engine=setup.engine, prompt_mean=inputs.prompt_mean, output_mean=inputs.output_mean,
        mean_context=setup.context, step_overhead_s=inputs.overhead, acceptance=inputs.acceptance,
        ngram_acceptance=inputs.ngram, plans=plans, warnings=warnings,
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f}" if seconds < 0.01 else f"{seconds * 1e3:,.1f}"


def render_speculation_plan(plan: SpeculationPlan, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(f"[bold]plan speculation[/]: {plan.model} with {plan.drafter_variant} drafter {plan.drafter} "
                  f"(block {plan.block_size}) on {plan.device}; weights {plan.weights}, engine {plan.engine}; "
                  f"mean live context {plan.mean_context:,.0f} tokens; step overhead {_ms(plan.step_overhead_s)} ms")
    console.print(f"acceptance per position ({plan.acceptance.source}): "
                  + ", ".join(f"{value:.2f}" for value in plan.acceptance.per_position))
    if plan.ngram_acceptance is not None:
        console.print(f"n-gram acceptance per position ({plan.ngram_acceptance.source}): "
                      + ", ".join(f"{value:.2f}" for value in plan.ngram_acceptance.per_position))
    for entry in plan.plans:
        table = Table(title=f"concurrency {entry.concurrency} (batch {entry.batch})", title_justify="left")
        for column in ("method", "K", "tau", "verify ms", "draft ms", "overhead ms", "step ms", "tok/s", "x"):
            table.add_column(column, justify="left" if column == "method" else "right")

        def add(option: Option, best: bool = False) -> None:
            mark = "[bold green]" if best else ""
            draft = f"{_ms(option.drafter_step_s)} ({option.drafter_bound[0]})" if option.drafter_bound else "-"
            table.add_row(f"{mark}{option.method}", str(option.draft_tokens), f"{option.tau:.2f}",
                          f"{_ms(option.target_step_s)} ({option.target_bound[0]})", draft, _ms(option.overhead_s),
                          _ms(option.step_time_s), f"{mark}{option.tokens_per_s:,.0f}", f"{option.speedup:.2f}")

        add(entry.no_speculation)
        for option in entry.drafter:
            add(option, option.draft_tokens == entry.best_k)
        for option in entry.ngram:
            if option.draft_tokens == entry.ngram_best_k:
                add(option)
        console.print(table)
    summary = Table(title="best K per concurrency (b: bandwidth-bound, c: compute-bound)", title_justify="left")
    for column in ("concurrency", "batch", "no spec tok/s", "best K", "tok/s", "x", "n-gram K", "n-gram tok/s", "advice"):
        summary.add_column(column, justify="left" if column == "advice" else "right")
    for entry in plan.plans:
        summary.add_row(str(entry.concurrency), str(entry.batch), f"{entry.no_speculation.tokens_per_s:,.0f}",
                        str(entry.best_k), f"{entry.best_tokens_per_s:,.0f}", f"{entry.best_speedup:.2f}",
                        "-" if entry.ngram_best_k is None else str(entry.ngram_best_k),
                        "-" if entry.ngram_best_tokens_per_s is None else f"{entry.ngram_best_tokens_per_s:,.0f}",
                        entry.recommendation)
    console.print(summary)
    for warning in plan.warnings:
        console.print(f"[yellow]warning[/]: {warning}")
