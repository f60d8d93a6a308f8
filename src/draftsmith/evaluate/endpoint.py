"""`draftsmith eval --endpoint`: the acceptance length a live serving engine really gets.

The engine serves the target with the drafter (vLLM `--speculative-config '{"method": "dflash",
...}'`, SGLang `--speculative-algorithm DFLASH`). Every prompt is sent as a chat completion, one
at a time (batch 1, like the in-process eval), and the engine's own speculative counters give:

- vLLM: Prometheus `/metrics` counters, read before and after the run (deltas, so earlier traffic
  does not count): `vllm:spec_decode_num_drafts_total` (verify steps),
  `vllm:spec_decode_num_draft_tokens_total`, `vllm:spec_decode_num_accepted_tokens_total` and
  `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="k"}`. τ = 1 + accepted / drafts.
- SGLang: each response's `meta_info` (`spec_verify_ct`, `completion_tokens`, and, by version,
  `spec_accept_histogram` / `spec_correct_drafts_histogram`, `spec_num_correct_drafts` /
  `spec_accepted_drafts` / `spec_accept_token_num`). τ = completion tokens / verify steps, which is
  SGLang's own `spec_accept_length`.

Tokens/s is completion tokens over the summed request latency. With `baseline_endpoint` (the same
target served without speculation) the same prompts run there too, giving the speed-up and, at
temperature 0, whether the outputs are token-identical (the engine-side losslessness check).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.core.errors import DraftsmithError, InputError

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass
class SpecCounters:
    """Speculative-decoding counts over a run: verify steps, drafted and accepted tokens."""

    drafts: int = 0  # verify steps (one drafted block each)
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [k] = steps accepting draft k+1

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        width = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        mine = self.accepted_per_position + [0] * (width - len(self.accepted_per_position))
        theirs = earlier.accepted_per_position + [0] * (width - len(earlier.accepted_per_position))
        return SpecCounters(
            self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens, self.accepted - earlier.accepted,
            [a - b for a, b in zip(mine, theirs)],
        )

    @property
    def tau(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [count / self.drafts if self.drafts else 0.0 for count in self.accepted_per_position]


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> {metric name: [(labels, value), ...]}."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        samples.setdefault(match["name"], []).append((labels, value))
    return samples


def vllm_spec_counters(metrics_text: str, model: str | None = None) -> SpecCounters | None:
    """vLLM's spec-decode counters summed over engines (for `model` when given); None if absent."""
    samples = parse_prometheus(metrics_text)
    if VLLM_DRAFTS not in samples:
        return None

    def keep(labels: dict[str, str]) -> bool:
        return model is None or labels.get("model_name", model) == model

    def total(name: str) -> int:
        return int(round(sum(value for labels, value in samples.get(name, []) if keep(labels))))

    per_position: dict[int, float] = {}
    for labels, value in samples.get(VLLM_ACCEPTED_PER_POS, []):
        if keep(labels) and "position" in labels:
            position = int(labels["position"])
            per_position[position] = per_position.get(position, 0.0) + value
    width = max(per_position) + 1 if per_position else 0
    return SpecCounters(
        drafts=total(VLLM_DRAFTS),
        draft_tokens=total(VLLM_DRAFT_TOKENS),
        accepted=total(VLLM_ACCEPTED),
        accepted_per_position=[int(round(per_position.get(k, 0.0))) for k in range(width)],
    )


def _first(meta: dict[str, Any], *names: str) -> Any:
    for name in names:
        if meta.get(name) is not None:
            return meta[name]
    return None


def sglang_meta_info(body: dict[str, Any]) -> dict[str, Any] | None:
    """The `meta_info` of an SGLang response (native /generate or OpenAI-style), if any."""
    if isinstance(body.get("meta_info"), dict):
        return body["meta_info"]
    for choice in body.get("choices") or []:
        if isinstance(choice, dict) and isinstance(choice.get("meta_info"), dict):
            return choice["meta_info"]
    return None


def sglang_spec_counters(meta_infos: Sequence[dict[str, Any]]) -> SpecCounters | None:
    """Sum SGLang per-request speculative fields; None when no response carries `spec_verify_ct`.

    Per verify step SGLang commits the accepted drafts plus one target token; the first token of a
    request comes from prefill, yet `spec_accept_length` = completion_tokens / spec_verify_ct
    counts it too, so accepted drafts are derived as completion_tokens - verify steps only when no
    explicit count is reported.
    """
    counters = SpecCounters()
    seen = False
    for index, meta in enumerate(meta_infos):
        verify = meta.get("spec_verify_ct")
        if verify is None:
            continue
        seen = True
        verify = int(verify)
        completion = int(meta.get("completion_tokens") or 0)
        histogram = _first(meta, "spec_correct_drafts_histogram", "spec_accept_histogram")
        accepted = _first(meta, "spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
        proposed = _first(meta, "spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
        if histogram is not None:
            if not isinstance(histogram, list) or not all(isinstance(c, (int, float)) for c in histogram):
                raise InputError(f"SGLang response {index}: spec_accept_histogram is not a list of counts: {histogram!r}")
            # histogram[a] = verify steps that accepted exactly a drafts.
            from_histogram = sum(a * int(c) for a, c in enumerate(histogram))
            if accepted is None:
                accepted = from_histogram
            width = len(histogram) - 1
            if len(counters.accepted_per_position) < width:
                counters.accepted_per_position += [0] * (width - len(counters.accepted_per_position))
            for position in range(width):
                counters.accepted_per_position[position] += sum(int(c) for c in histogram[position + 1:])
        if accepted is None:
            accepted = max(0, completion - verify)
        counters.drafts += verify
        counters.accepted += int(accepted)
        counters.draft_tokens += int(proposed or 0)
    return counters if seen else None


@dataclass
class EndpointRun:
    """One pass over the prompts on one endpoint."""

    endpoint: str
    model: str
    completion_tokens: int
    seconds: float
    outputs: list[list[int] | str]  # token ids when the engine returns them, else the text
    meta_infos: list[dict[str, Any]]

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0


@dataclass
class EndpointReport:
    endpoint: str
    source: str  # "vllm /metrics" or "sglang meta_info"
    model: str
    tau: float
    per_position_acceptance: list[float]
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_prompts: int
    total_new_tokens: int
    max_new_tokens: int
    temperature: float
    tokens_per_s: float
    baseline_endpoint: str | None = None
    baseline_tokens_per_s: float | None = None
    speedup: float | None = None
    identical_to_baseline: bool | None = None
    mismatched_prompts: list[str] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list, repr=False)
    # What the engine was asked: chat_template_kwargs sent with every request (None: none sent, so the
    # engine's template default decided), and that as one phrase for people.
    chat_template_kwargs: dict[str, Any] | None = None
    thinking_mode: str = "enable_thinking not sent (the engine's chat template default)"
    # [k] = verify steps that accepted draft position k+1 (the counts behind per_position_acceptance).
    accepted_per_position: list[int] = field(default_factory=list)

    kind: str = "draftsmith.eval.endpoint"
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @property
    def verdict(self) -> str:
        speed = f" vs {self.baseline_tokens_per_s:.1f} tok/s baseline ({self.speedup:.2f}x)" if self.speedup else ""
        same = ""
        if self.identical_to_baseline is not None:
            same = ", identical to baseline" if self.identical_to_baseline else (
                f", DIFFERS from baseline for {len(self.mismatched_prompts)} prompts")
        return (f"engine tau {self.tau:.2f} over {self.num_drafts} verify steps ({self.source}), "
                f"{self.tokens_per_s:.1f} tok/s{speed}{same}; {self.thinking_mode}")

    def render(self, console) -> None:
        from rich.table import Table

        summary = Table(title=f"speculative decoding on {self.endpoint}", show_header=False)
        summary.add_row("acceptance length tau", f"{self.tau:.3f}  (from {self.source})")
        summary.add_row("prompts / new tokens / verify steps", f"{self.num_prompts} / {self.total_new_tokens} / {self.num_drafts}")
        summary.add_row("tokens/s", f"{self.tokens_per_s:.1f}")
        summary.add_row("thinking mode", self.thinking_mode)
        if self.baseline_tokens_per_s is not None:
            summary.add_row("baseline tokens/s", f"{self.baseline_tokens_per_s:.1f}")
            summary.add_row("speed-up", f"{self.speedup:.2f}x")
        if self.identical_to_baseline is not None:
            summary.add_row("greedy output identical to baseline", "yes" if self.identical_to_baseline else "[bold red]NO[/]")
        console.print(summary)
        positions = Table(title="acceptance per draft position")
        positions.add_column("position", justify="right")
        positions.add_column("accepted", justify="right")
        positions.add_column("")
        for k, rate in enumerate(self.per_position_acceptance, start=1):
            positions.add_row(str(k), f"{rate:.1%}", "#" * round(40 * rate))
        console.print(positions)


async def _served_model(client, base: str) -> str:
    status, body = await client.get_json(base + "/v1/models")
    try:
        return body["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise DraftsmithError(f"{base}/v1/models answered HTTP {status} without a model; pass --model") from None


async def _metrics(client, base: str) -> str | None:
    from draftsmith.client.chat import EndpointConnectionError

    try:
        status, text = await client.get_text(base + "/metrics", timeout_s=10.0)
    except EndpointConnectionError:
        return None
    return text if status == 200 else None


async def _run_prompts(client, base: str, model: str | None, conversations, max_new_tokens: int,
                       temperature: float, seed: int | None, extra_body: dict[str, Any] | None,
                       progress: Callable[[int, int], None] | None) -> EndpointRun:
    from draftsmith.client.chat import chat_payload

    model = model or await _served_model(client, base)
    payload = chat_payload(model, max_new_tokens, temperature=temperature, seed=seed, return_token_ids=True,
                           extra_body=extra_body)
    outputs: list[list[int] | str] = []
    metas: list[dict[str, Any]] = []
    tokens = 0
    seconds = 0.0
    for done, request in enumerate(conversations, start=1):
        result = await client.chat(base, {**payload, **request})
        count = result.completion_tokens
        if count is None:
            count = len(result.completion_token_ids or [])
        tokens += count
        seconds += result.latency_s
        outputs.append(result.completion_token_ids if result.completion_token_ids else result.reasoning + result.content)
        meta = sglang_meta_info(result.raw)
        if meta is not None:
            metas.append(meta)
        if progress is not None:
            progress(done, len(conversations))
    return EndpointRun(base, model, tokens, seconds, outputs, metas)


def _conversations(prompts, limit: int | None, split: str | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    from draftsmith.evaluate.prompts import Prompt, prompt_from_row, read_prompts

    if isinstance(prompts, (str, Path)):
        items: list[Any] = read_prompts(prompts, limit=limit, split=split)
    else:
        items = list(prompts)[:limit] if limit else list(prompts)
    ids, conversations = [], []
    for index, item in enumerate(items):
        if isinstance(item, dict):
            item = prompt_from_row(item, f"prompt {index}")
        if not isinstance(item, Prompt) or item.messages is None:
            raise InputError(f"prompt {index}: eval --endpoint sends chat completions; it needs conversation prompts "
                             "(messages or conversations), not raw text or token ids")
        ids.append(item.id)
        # The engine renders tools into the prompt as the in-process eval's chat template does.
        conversations.append({"messages": item.messages, **({"tools": item.tools} if item.tools else {})})
    if not conversations:
        raise InputError("no prompts to evaluate")
    return ids, conversations


async def evaluate_endpoint_async(
    endpoint: str,
    prompts: str | Path | Sequence[Any],
    *,
    baseline_endpoint: str | None = None,
    model: str | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
    limit: int | None = None,
    enable_thinking: bool | None = None,
    timeout_s: float = 600.0,
    progress: Callable[[int, int], None] | None = None,
    split: str | None = None,
) -> EndpointReport:
    from draftsmith.client.chat import ChatClient, normalize_base_url

    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompt_ids, conversations = _conversations(prompts, limit, split)
    base = normalize_base_url(endpoint)
    extra: dict[str, Any] = {}
    if enable_thinking is not None:
        extra["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
    async with ChatClient(connections=4, timeout_s=timeout_s) as client:
        served = model or await _served_model(client, base)
        before_text = await _metrics(client, base)
        before = vllm_spec_counters(before_text, served) if before_text else None
        # SGLang returns meta_info on the OpenAI route only when asked; vLLM ignores the field.
        run = await _run_prompts(client, base, served, conversations, max_new_tokens, temperature, seed,
                                 {**extra, "return_meta_info": True} if before is None else extra or None, progress)
        counters: SpecCounters | None = None
        source = ""
        if before is not None:
            after = vllm_spec_counters(await _metrics(client, base) or "", served)
            if after is not None:
                counters, source = after.minus(before), "vllm /metrics"
        if counters is None:
            counters = sglang_spec_counters(run.meta_infos)
            source = "sglang meta_info"
        if counters is None or counters.drafts == 0:
            raise DraftsmithError(
                f"{base}: the engine reported no speculative decoding (no vLLM spec_decode counters on /metrics "
                "moved, no SGLang spec_verify_ct in meta_info); is it serving with a drafter?"
            )
        baseline = None
        if baseline_endpoint:
            baseline_base = normalize_base_url(baseline_endpoint)
            baseline = await _run_prompts(client, baseline_base, model, conversations, max_new_tokens, temperature,
                                          seed, extra or None, None)
    mismatched: list[str] = []
    identical = None
    if baseline is not None and temperature == 0:
        mismatched = [pid for pid, a, b in zip(prompt_ids, run.outputs, baseline.outputs) if a != b]
        identical = not mismatched
    return EndpointReport(
        endpoint=base,
        source=source,
        model=served,
        tau=counters.tau,
        per_position_acceptance=counters.per_position_acceptance,
        num_drafts=counters.drafts,
        num_draft_tokens=counters.draft_tokens,
        num_accepted_tokens=counters.accepted,
        num_prompts=len(conversations),
        total_new_tokens=run.completion_tokens,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        tokens_per_s=run.tokens_per_s,
        baseline_endpoint=baseline.endpoint if baseline else None,
        baseline_tokens_per_s=baseline.tokens_per_s if baseline else None,
        speedup=(run.tokens_per_s / baseline.tokens_per_s) if baseline and baseline.tokens_per_s else None,
        identical_to_baseline=identical,
        mismatched_prompts=mismatched,
        prompt_ids=prompt_ids,
        outputs=run.outputs,
        chat_template_kwargs=extra.get("chat_template_kwargs"),
        thinking_mode=thinking_mode(enable_thinking),
        accepted_per_position=counters.accepted_per_position,
    )


def thinking_mode(enable_thinking: bool | None) -> str:
    """How the measured requests set thinking: the drafter's acceptance depends on it."""
    if enable_thinking is None:
        return "enable_thinking not sent (the engine's chat template default)"
    return f"enable_thinking={str(bool(enable_thinking)).lower()} sent in chat_template_kwargs"


def evaluate_endpoint(endpoint: str, prompts, **options) -> EndpointReport:
    """Blocking `evaluate_endpoint_async` (see the module docstring)."""
    from draftsmith.core.asyncrun import run_async

    return run_async(evaluate_endpoint_async(endpoint, prompts, **options))
