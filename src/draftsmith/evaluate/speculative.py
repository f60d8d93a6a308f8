"""`draftsmith eval` in this process: real DFlash speculative decoding against plain decoding of
the same target, on every prompt, with tau, the acceptance histogram, tokens/s and the
losslessness check.

The decode loops themselves live in `draftsmith.model.speculative` (the trainer runs them at
checkpoints too). Greedy verification makes the speculative output identical to plain greedy
decoding of the target, up to floating-point differences between a 1-token and a B-token forward;
`evaluate_drafter` checks that token for token for every prompt and fails loudly when it does not hold.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.paths import require_dir
from draftsmith.model import DFlashDraftModel, load_drafter
from draftsmith.model.speculative import (  # noqa: F401  (re-exported: draftsmith.evaluate's public names)
    DecodeResult,
    accept_probability,
    default_stop_token_ids,
    greedy_decode,
    sample_decode,
    speculative_decode,
)


class LosslessnessError(DraftsmithError):
    """Greedy speculative output differed from plain greedy target output."""


@dataclass
class PromptResult:
    id: str
    prompt_tokens: int
    new_tokens: int
    cycles: int
    tau: float
    speculative_seconds: float
    target_seconds: float
    identical: bool
    first_mismatch: int | None = None


@dataclass
class EvalReport:
    tau: float
    acceptance_histogram: dict[int, int]
    block_size: int
    num_prompts: int
    total_new_tokens: int
    total_cycles: int
    speculative_tokens_per_s: float
    target_tokens_per_s: float
    speedup: float
    lossless: bool | None  # greedy: outputs token-identical; None when sampling (checked by distribution in tests)
    mismatched_prompts: list[str]
    max_new_tokens: int
    per_prompt: list[PromptResult]
    temperature: float = 0.0
    # [k-1] = share of cycles whose draft position k (1..B-1) was accepted.
    per_position_acceptance: list[float] = field(default_factory=list)
    # Counted like vLLM's /metrics: drafts that matched past a stop token count too.
    tau_engine_counting: float = 0.0
    per_position_acceptance_engine_counting: list[float] = field(default_factory=list)

    kind: str = "draftsmith.eval"
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["acceptance_histogram"] = {str(k): v for k, v in sorted(self.acceptance_histogram.items())}
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @property
    def verdict(self) -> str:
        if self.lossless is None:
            status = f"speculative sampling at T={self.temperature:g}"
        else:
            status = "lossless" if self.lossless else f"NOT LOSSLESS ({len(self.mismatched_prompts)} prompts differ)"
        return (
            f"tau {self.tau:.2f} (block {self.block_size}) over {self.total_cycles} cycles, "
            f"{self.speculative_tokens_per_s:.1f} vs {self.target_tokens_per_s:.1f} tok/s "
            f"({self.speedup:.2f}x), {status}"
        )

    def render(self, console) -> None:
        from rich.table import Table

        summary = Table(title="DFlash speculative decoding", show_header=False)
        summary.add_row("acceptance length tau", f"{self.tau:.3f}  (1 = no draft accepted, max {self.block_size})")
        summary.add_row("prompts / new tokens / cycles", f"{self.num_prompts} / {self.total_new_tokens} / {self.total_cycles}")
        summary.add_row("speculative tokens/s", f"{self.speculative_tokens_per_s:.1f}")
        summary.add_row("plain greedy target tokens/s", f"{self.target_tokens_per_s:.1f}")
        summary.add_row("speed-up", f"{self.speedup:.2f}x")
        if self.lossless is None:
            summary.add_row("sampling temperature", f"{self.temperature:g} (outputs differ per seed by design)")
        else:
            summary.add_row(
                "lossless (greedy output identical)",
                "yes" if self.lossless else f"[bold red]NO[/] — differs for {', '.join(self.mismatched_prompts[:5])}",
            )
        console.print(summary)
        histogram = Table(title="accepted tokens per cycle")
        histogram.add_column("length", justify="right")
        histogram.add_column("cycles", justify="right")
        histogram.add_column("share", justify="right")
        histogram.add_column("")
        total = max(1, sum(self.acceptance_histogram.values()))
        for length in range(1, self.block_size + 1):
            count = self.acceptance_histogram.get(length, 0)
            histogram.add_row(str(length), str(count), f"{count / total:.1%}", "#" * round(40 * count / total))
        console.print(histogram)


def per_position_acceptance(histogram: dict[int, int], block_size: int) -> list[float]:
    """Share of cycles in which draft position k = 1..B-1 was accepted.

    A cycle committing L tokens accepted its first L-1 drafted positions (the last token is the
    target's bonus), so position k was accepted exactly when L >= k+1.
    """
    total = sum(histogram.values())
    if not total:
        return [0.0] * (block_size - 1)
    return [sum(count for length, count in histogram.items() if length >= k + 1) / total for k in range(1, block_size)]


def _first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def _encode(tokenizer, prompt, enable_thinking: bool | None) -> list[int]:
    if prompt.messages is not None:
        kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        if prompt.tools:
            kwargs["tools"] = prompt.tools
        text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True, **kwargs)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt.text, add_special_tokens=False)["input_ids"]


def evaluate_drafter(
    target: str | Path | torch.nn.Module,
    drafter: str | Path | DFlashDraftModel,
    prompts: str | Path | Sequence[Any],
    max_new_tokens: int = 256,
    tokenizer=None,
    block_size: int | None = None,
    limit: int | None = None,
    enable_thinking: bool | None = None,
    dtype: torch.dtype = torch.float32,
    strict: bool = True,
    progress: Callable[[int, int], None] | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    split: str | None = None,
) -> EvalReport:
    """Speculative vs plain decoding on every prompt; tau, histogram, tokens/s, lossless check.

    `prompts` is a file (see `read_prompts`), a list of `Prompt`s / rows, or a list of token-id
    lists. At temperature 0 (greedy) with `strict` (default) a non-identical output raises
    `LosslessnessError` naming the prompts and the first differing position; otherwise the report
    says so in `lossless`. Above 0 both sides sample (speculative sampling vs plain sampling, seeded
    by `seed`); single outputs then differ by design and `lossless` is None.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.evaluate.prompts import Prompt, prompt_from_row, read_prompts

    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise InputError(f"temperature must be >= 0, got {temperature}")
    if isinstance(prompts, (str, Path)):
        prompts = read_prompts(prompts, limit=limit, split=split)
    # Bad prompts or a broken drafter are reported before the target spends seconds loading.
    drafter_from_path = isinstance(drafter, (str, Path))
    if drafter_from_path:
        drafter = load_drafter(drafter)
    if isinstance(target, (str, Path)):
        target_path = require_dir(target, "--target")
        if not (target_path / "config.json").is_file():
            raise InputError(f"{target_path}: not a model directory (no config.json)")
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(target_path)
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype)
    target = target.eval()
    if drafter_from_path:
        drafter = drafter.to(next(target.parameters()).dtype)
    drafter = drafter.eval()
    _check_pair(target, drafter)

    items: list[Any] = list(prompts)[:limit] if limit else list(prompts)
    encoded: list[tuple[str, list[int]]] = []
    for index, item in enumerate(items):
        if isinstance(item, dict):
            item = prompt_from_row(item, f"prompt {index}")
        if isinstance(item, Prompt):
            if tokenizer is None:
                raise InputError("evaluate_drafter needs a tokenizer for text/message prompts")
            encoded.append((item.id, _encode(tokenizer, item, enable_thinking)))
        else:
            encoded.append((str(index), [int(t) for t in item]))
    stops = default_stop_token_ids(target, tokenizer)
    device = next(target.parameters()).device
    block = int(block_size or drafter.block_size)

    # One short untimed pass of each decoder so first-call allocation does not skew the timings.
    warm = torch.tensor([encoded[0][1]], device=device)
    greedy_decode(target, warm, min(4, max_new_tokens), stops)
    speculative_decode(target, drafter, warm, min(4, max_new_tokens), stops, block)

    results: list[PromptResult] = []
    histogram: Counter[int] = Counter()
    raw_accepted = 0
    accepted_at = [0] * (block - 1)  # cycles whose draft at position k+1 matched (before stop cuts)
    spec_tokens = spec_seconds = target_tokens = target_seconds = 0.0
    sampling = temperature > 0
    for done, (prompt_id, ids) in enumerate(encoded, start=1):
        input_ids = torch.tensor([ids], device=device)
        if sampling:
            plain = sample_decode(target, input_ids, max_new_tokens, stops, temperature,
                                  torch.Generator(device=device).manual_seed(seed + done))
            spec = speculative_decode(target, drafter, input_ids, max_new_tokens, stops, block, temperature=temperature,
                                      generator=torch.Generator(device=device).manual_seed(seed + done))
            mismatch = _first_mismatch(plain.tokens, spec.tokens)  # reported, but expected at T > 0
        else:
            plain = greedy_decode(target, input_ids, max_new_tokens, stops)
            spec = speculative_decode(target, drafter, input_ids, max_new_tokens, stops, block)
            mismatch = _first_mismatch(plain.tokens, spec.tokens)
        histogram.update(spec.acceptance_lengths)
        raw_accepted += sum(spec.accepted_drafts)
        for count in spec.accepted_drafts:
            for position in range(count):
                accepted_at[position] += 1
        spec_tokens += len(spec.tokens)
        spec_seconds += spec.seconds
        target_tokens += len(plain.tokens)
        target_seconds += plain.seconds
        cycles = len(spec.acceptance_lengths)
        results.append(
            PromptResult(
                id=prompt_id,
                prompt_tokens=len(ids),
                new_tokens=len(spec.tokens),
                cycles=cycles,
                # The first token comes from prefill, not from a cycle.
                tau=(sum(spec.acceptance_lengths) / cycles) if cycles else 0.0,
                speculative_seconds=spec.seconds,
                target_seconds=plain.seconds,
                identical=mismatch is None,
                first_mismatch=mismatch,
            )
        )
        if progress is not None:
            progress(done, len(encoded))

    total_cycles = sum(histogram.values())
    mismatched = [] if sampling else [r.id for r in results if not r.identical]
    # Counted like vLLM's accepted_tokens_per_pos: a draft that matched counts even past a stop token.
    per_position = [count / total_cycles if total_cycles else 0.0 for count in accepted_at]
    spec_rate = spec_tokens / spec_seconds if spec_seconds else 0.0
    target_rate = target_tokens / target_seconds if target_seconds else 0.0
    report = EvalReport(
        tau=(sum(k * v for k, v in histogram.items()) / total_cycles) if total_cycles else 0.0,
        acceptance_histogram=dict(histogram),
        block_size=block,
        num_prompts=len(results),
        total_new_tokens=int(spec_tokens),
        total_cycles=total_cycles,
        speculative_tokens_per_s=spec_rate,
        target_tokens_per_s=target_rate,
        speedup=spec_rate / target_rate if target_rate else 0.0,
        lossless=None if sampling else not mismatched,
        mismatched_prompts=mismatched,
        max_new_tokens=max_new_tokens,
        per_prompt=results,
        temperature=temperature,
        per_position_acceptance=per_position_acceptance(histogram, block),
        tau_engine_counting=1 + raw_accepted / total_cycles if total_cycles else 0.0,
        per_position_acceptance_engine_counting=per_position,
    )
    if strict and mismatched:
        raise LosslessnessError(_mismatch_message(report))
    return report


def _mismatch_message(report: EvalReport) -> str:
    details = ", ".join(
        f"{r.id} (first difference at new token {r.first_mismatch})" for r in report.per_prompt if not r.identical
    )
    return (
        f"speculative greedy output differs from plain greedy target output for {len(report.mismatched_prompts)} "
        f"of {report.num_prompts} prompts: {details}"
    )


def _check_pair(target, drafter: DFlashDraftModel) -> None:
    target_config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    problems = []
    if target_config.hidden_size != drafter.config.hidden_size:
        problems.append(f"hidden_size {drafter.config.hidden_size} != target {target_config.hidden_size}")
    if max(drafter.target_layer_ids) >= target_config.num_hidden_layers:
        problems.append(
            f"target_layer_ids {drafter.target_layer_ids} exceed the target's {target_config.num_hidden_layers} layers"
        )
    if drafter.mask_token_id >= target.get_input_embeddings().num_embeddings:
        problems.append(f"mask_token_id {drafter.mask_token_id} is outside the target's embedding table")
    if problems:
        raise InputError("drafter does not fit this target: " + "; ".join(problems))
