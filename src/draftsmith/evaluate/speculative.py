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
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.io import dumps_json
from draftsmith.data.prompts import generation_prompt_ids
from draftsmith.data.thinking import choose_thinking
from draftsmith.evaluate.prompts import Prompt, prompt_from_row, read_prompts
from draftsmith.model import DEFAULT_BLOCK_SIZE, DFlashDraftModel, build_drafter_config, load_drafter
from draftsmith.model.features import choose_mask_token, drafter_mask_line
from draftsmith.model.target import load_target_model
from draftsmith.model.speculative import (  # noqa: F401  (re-exported: draftsmith.evaluate's public names)
    DecodeResult,
    accept_probability,
    default_stop_token_ids,
    greedy_decode,
    prompt_lookup_decode,
    prompt_lookup_drafts,
    sample_decode,
    speculative_decode,
)

# What `--baseline` can add beside the drafter: prompt-lookup (n-gram) speculation, and a randomly
# initialised drafter of the same config (what training starts from).
BASELINES = ("ngram", "untrained")


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
    # Greedy: positions where the outputs part at a near-tie of the target (see `check_greedy`).
    near_ties: list[int] = field(default_factory=list)
    # [k-1] = cycles whose draft position k matched, counted like vLLM's /metrics (past a stop token too).
    accepted_per_position: list[int] = field(default_factory=list)


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
    # Greedy: the top-2 logit margin within which a difference is a near-tie (reported, not a failure).
    tie_tolerance: float | None = None
    near_ties: int = 0
    near_tie_prompts: list[str] = field(default_factory=list)
    device: str = "cpu"
    dtype: str = "float32"
    # dflash or dspark: the given drafter (by its variant); ngram: prompt-lookup drafts; untrained: a random
    # drafter of its config.
    method: str = "dflash"
    # Tokens the target verifies per cycle, the most a cycle commits: block_size for DFlash (B-1 drafts and
    # the target's token), block_size + 1 for DSpark (it drafts B from the anchor). 0: block_size.
    verify_tokens: int = 0
    # The --baseline methods, decoded on the same prompts against the same plain target output.
    baselines: list[EvalReport] = field(default_factory=list)

    kind: str = "draftsmith.eval"
    version: int = 1

    @property
    def max_tau(self) -> int:
        return self.verify_tokens or self.block_size

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["acceptance_histogram"] = {str(k): v for k, v in sorted(self.acceptance_histogram.items())}
        data["baselines"] = [baseline.to_dict() for baseline in self.baselines]
        return data

    @property
    def methods(self) -> list[EvalReport]:
        return [self, *self.baselines]

    @property
    def not_lossless(self) -> list[EvalReport]:
        """The methods (this one and the baselines) whose greedy output differed from the target's."""
        return [report for report in self.methods if report.lossless is False]

    def to_json(self) -> str:
        return dumps_json(self.to_dict())

    @property
    def verdict(self) -> str:
        if self.lossless is None:
            status = f"speculative sampling at T={self.temperature:g}"
        else:
            status = "lossless" if self.lossless else f"NOT LOSSLESS ({len(self.mismatched_prompts)} prompts differ)"
            if self.near_ties:
                status += f", {self.near_ties} near-ties within {self.tie_tolerance:g} logits"
        others = "".join(f"; {b.method} tau {b.tau:.2f} ({b.speedup:.2f}x)" for b in self.baselines)
        return (
            f"{self.method} tau {self.tau:.2f} (block {self.block_size}) over {self.total_cycles} cycles, "
            f"{self.speculative_tokens_per_s:.1f} vs {self.target_tokens_per_s:.1f} tok/s "
            f"({self.speedup:.2f}x), {status}{others}"
        )

    def render(self, console) -> None:
        from rich.table import Table

        summary = Table(title="DFlash speculative decoding", show_header=False)
        summary.add_row("acceptance length tau", f"{self.tau:.3f}  (1 = no draft accepted, max {self.max_tau})")
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
            summary.add_row(
                f"near-ties (top-2 margin <= {self.tie_tolerance:g})",
                f"{self.near_ties} in {len(self.near_tie_prompts)} prompts (floating point, not counted as differences)",
            )
        console.print(summary)
        histogram = Table(title="accepted tokens per cycle")
        histogram.add_column("length", justify="right")
        histogram.add_column("cycles", justify="right")
        histogram.add_column("share", justify="right")
        histogram.add_column("")
        total = max(1, sum(self.acceptance_histogram.values()))
        for length in range(1, self.max_tau + 1):
            count = self.acceptance_histogram.get(length, 0)
            histogram.add_row(str(length), str(count), f"{count / total:.1%}", "#" * round(40 * count / total))
        console.print(histogram)
        if self.baselines:
            self._render_comparison(console)

    def _render_comparison(self, console) -> None:
        from rich.table import Table

        table = Table(title="same prompts, same target output: tau by draft method")
        for column in ("method", "tau", "cycles", "speculative tok/s", "speed-up", "lossless"):
            table.add_column(column, justify="left" if column == "method" else "right")
        for report in self.methods:
            lossless = "n/a" if report.lossless is None else ("yes" if report.lossless else "[bold red]NO[/]")
            table.add_row(report.method, f"{report.tau:.3f}", str(report.total_cycles),
                          f"{report.speculative_tokens_per_s:.1f}", f"{report.speedup:.2f}x", lossless)
        console.print(table)


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
        return generation_prompt_ids(tokenizer, prompt.messages, prompt.tools, kwargs)
    return tokenizer(prompt.text, add_special_tokens=False)["input_ids"]


# A greedy difference where the reference's top-2 logit margin is at most this, and the speculative
# side took the reference's runner-up, is a near-tie: a 1-token decode and a B-token verify round
# differently, so a correct drafter can flip it. float32 differs by ~1e-5 between the two; bf16
# logits of 16-32 (where a Qwen-style target's top logits sit) are 0.125 apart, so 0.5 is four
# bf16 steps of the logit itself plus the drift of a deep bf16 forward; fp16 has 8x finer steps.
TIE_TOLERANCE = {"float32": 1e-3, "float16": 0.125, "bfloat16": 0.5}


def default_tie_tolerance(dtype: torch.dtype) -> float:
    return TIE_TOLERANCE.get(str(dtype).removeprefix("torch."), TIE_TOLERANCE["float32"])


def check_greedy(
    target, input_ids: torch.Tensor, reference: DecodeResult, tokens: Sequence[int], max_new_tokens: int,
    stop_token_ids: Sequence[int], tolerance: float,
) -> tuple[int | None, list[int]]:
    """(first real difference or None, near-tie positions) of speculative `tokens` against the
    greedy `reference`.

    A difference at position i is a near-tie when the reference's top-2 margin there is within
    `tolerance` and `tokens[i]` is the reference's runner-up; the reference is then continued
    greedily from the speculative prefix and compared again, so every token is still checked.
    """
    near_ties: list[int] = []
    offset = 0
    while (mismatch := _first_mismatch(reference.tokens, tokens[offset:])) is not None:
        position = offset + mismatch
        near_tie = (
            mismatch < len(reference.margins) and position < len(tokens)
            and reference.margins[mismatch] <= tolerance and tokens[position] == reference.runners_up[mismatch]
        )
        if not near_tie:
            return position, near_ties
        near_ties.append(position)
        offset = position + 1
        if offset >= max_new_tokens or tokens[position] in stop_token_ids:
            break
        prefix = torch.cat([input_ids, torch.tensor([tokens[:offset]], device=input_ids.device)], dim=1)
        reference = greedy_decode(target, prefix, max_new_tokens - offset, stop_token_ids)
    return None, near_ties


def _check_arguments(max_new_tokens: int, temperature: float, tie_tolerance: float | None, baselines: Sequence[str],
                     more_drafters: Mapping[str, Any], has_drafter: bool, ngram_max: int, ngram_min: int) -> None:
    """`evaluate_drafter`'s numbers and names, before anything loads (InputError naming the first bad one)."""
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0 <= temperature < float("inf"):
        raise InputError(f"temperature must be a finite number >= 0, got {temperature}")
    if tie_tolerance is not None and not 0 <= tie_tolerance < float("inf"):
        raise InputError(f"tie_tolerance must be >= 0, got {tie_tolerance}")
    unknown = [name for name in baselines if name not in BASELINES]
    if unknown or len(set(baselines)) != len(baselines):
        raise InputError(f"baselines must be distinct names among {', '.join(BASELINES)}; got {list(baselines)}")
    clashing = sorted(set(more_drafters) & {"dflash", *BASELINES})
    if clashing:
        raise InputError(f"more_drafters may not be named {', '.join(clashing)} (method names of eval)")
    if not has_drafter and not baselines and not more_drafters:
        raise InputError("evaluate_drafter needs a drafter or at least one baseline")
    if not 1 <= ngram_min <= ngram_max:
        raise InputError(f"n-gram sizes need 1 <= ngram_min <= ngram_max; got {ngram_min}, {ngram_max}")


def _drafters_beside(target, drafter, drafter_from_path: bool, loaded: Mapping[str, DFlashDraftModel], untrained: bool,
                     block: int, mask_token_id: int | None, tokenizer, seed: int) -> dict[str, DFlashDraftModel]:
    """method -> drafter on the target's device, each checked against it: the drafter ("dflash"; in the
    target's dtype when loaded from a directory), the untrained baseline, then `loaded` by name."""
    first = next(target.parameters())
    drafters: dict[str, DFlashDraftModel] = {}
    if drafter is not None:
        drafters["dflash"] = drafter.to(device=first.device, dtype=first.dtype if drafter_from_path else None).eval()
    if untrained:
        drafters["untrained"] = untrained_drafter(target, drafter, block, mask_token_id, tokenizer, seed).to(
            device=first.device, dtype=first.dtype).eval()
    for name, model in loaded.items():
        drafters[name] = model.to(device=first.device, dtype=first.dtype).eval()
    for model in drafters.values():
        _check_pair(target, model)
    return drafters


def evaluate_drafter(
    target: str | Path | torch.nn.Module,
    drafter: str | Path | DFlashDraftModel | None,
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
    device: str | torch.device | None = None,
    tie_tolerance: float | None = None,
    baselines: Sequence[str] = (),
    ngram_max: int = 3,
    ngram_min: int = 1,
    mask_token_id: int | None = None,
    more_drafters: Mapping[str, str | Path | DFlashDraftModel] | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> EvalReport:
    """Speculative vs plain decoding on every prompt; tau, histogram, tokens/s, lossless check.

    `prompts` is a file (see `read_prompts`), a list of `Prompt`s / rows, or a list of token-id
    lists. A target given as a directory loads straight to `device` (default cpu) in `dtype`; the
    drafter moves to the target's device (and, loaded from a directory, to its dtype). At temperature 0 (greedy) with `strict`
    (default) a real difference raises `LosslessnessError` naming the prompts and the first
    differing position; otherwise the report says so in `lossless`. A difference at a near-tie of
    the target (top-2 margin within `tie_tolerance`, default by dtype: `TIE_TOLERANCE`) is counted
    in `near_ties`, not a failure. Above 0 both sides sample (speculative sampling vs plain
    sampling, seeded by `seed`); single outputs then differ by design and `lossless` is None.

    `baselines` (see `BASELINES`) are decoded on the same prompts with the same block size and
    checked against the same plain target output: "ngram" drafts by prompt lookup (n-grams of
    `ngram_max` down to `ngram_min` tokens), "untrained" is a drafter of the given drafter's config
    with random weights (seeded by `seed`), or without a drafter one built from the target (its
    `<|MASK|>` token, or `mask_token_id`). They land in `report.baselines`; without a drafter the
    first baseline is the report itself. `more_drafters` (name -> drafter, e.g. the checkpoints of
    a learning curve) are decoded the same way and reported after the baselines under their names,
    so the plain target decode runs once for all of them. `progress(done, total)` is told of each
    prompt finished (and of the total before the first), `on_tokens(n)` of every n tokens any of the
    decoders commits (plain and each method), so a long prompt shows progress while it runs.
    """
    more_drafters = dict(more_drafters or {})
    _check_arguments(max_new_tokens, temperature, tie_tolerance, baselines, more_drafters, drafter is not None,
                     ngram_max, ngram_min)
    if isinstance(prompts, (str, Path)):
        prompts = read_prompts(prompts, limit=limit, split=split)
    # Bad prompts or a broken drafter are reported before the target spends seconds loading.
    drafter_from_path = isinstance(drafter, (str, Path))
    if drafter_from_path:
        drafter = load_drafter(drafter)
    loaded = {name: load_drafter(model) if isinstance(model, (str, Path)) else model for name, model in more_drafters.items()}
    if isinstance(target, (str, Path)):
        target, tokenizer = _load_target(target, tokenizer, device or "cpu", dtype)
    target = target.eval()
    first = next(target.parameters())
    block = int(block_size or (drafter.block_size if drafter is not None else DEFAULT_BLOCK_SIZE))
    drafters = _drafters_beside(target, drafter, drafter_from_path, loaded, "untrained" in baselines, block,
                                mask_token_id, tokenizer, seed)
    if tokenizer is not None:
        thinking = choose_thinking(getattr(tokenizer, "chat_template", None), {}, enable_thinking, send_default=False)
        print(f"draftsmith: eval: {thinking.line}", file=sys.stderr)
        enable_thinking = thinking.kwargs.get("enable_thinking")  # not passed to a template without a switch
    if drafter is not None:
        rows = target.get_input_embeddings().num_embeddings
        print(f"draftsmith: eval: {drafter_mask_line(drafter.config, tokenizer, rows)}", file=sys.stderr)

    encoded = _encode_prompts(list(prompts)[:limit] if limit else list(prompts), tokenizer, enable_thinking)
    methods = [name for name in ("dflash", *baselines, *loaded) if name != "dflash" or drafter is not None]
    stops = default_stop_token_ids(target, tokenizer)
    on_tokens = _watch_long_run(on_tokens, len(encoded), max_new_tokens, methods, first)
    print(f"draftsmith: eval: decoding stops at token ids {stops}"
          + (f" ({', '.join(map(repr, tokenizer.convert_ids_to_tokens(stops)))})" if tokenizer is not None and stops else ""),
          file=sys.stderr)
    run = _Run(
        target, stops=stops, block=block,
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        tolerance=default_tie_tolerance(first.dtype) if tie_tolerance is None else tie_tolerance,
        drafters=drafters, ngram=(ngram_max, ngram_min), methods=methods, on_tokens=on_tokens,
    )
    if progress is not None:
        progress(0, len(encoded))  # the bar shows its total before the first (maybe long) prompt ends
    run.warm_up(encoded[0][1])
    for done, (prompt_id, ids) in enumerate(encoded, start=1):
        run.prompt(prompt_id, ids, done)
        if progress is not None:
            progress(done, len(encoded))
    report = run.report()
    if strict and report.not_lossless:
        raise LosslessnessError(_mismatch_message(report))
    return report


def _watch_long_run(on_tokens, prompts: int, max_new_tokens: int, methods: list[str], first: torch.Tensor):
    """`on_tokens` that also warns once when a CPU eval projects to hours: every prompt decoded
    plainly and by each method, up to `max_new_tokens` each (an upper bound: stops end prompts early)."""
    from draftsmith.core.config import cpu_multiplies_bf16_natively
    from draftsmith.core.progress import LongRunWarning

    cuts = [f"--limit (now {prompts} prompts)", f"--max-new-tokens (now {max_new_tokens})"]
    if len(methods) > 1:
        cuts.append(f"fewer methods (now {', '.join(methods)}: each decodes every prompt again)")
    if first.dtype != torch.bfloat16 and cpu_multiplies_bf16_natively():
        cuts.append("--dtype bf16 (this CPU multiplies bf16 natively)")
    long_run = LongRunWarning("eval", prompts * max_new_tokens * (1 + len(methods)), "token", cuts,
                              enabled=first.device.type == "cpu", bound="up to ", after_units=16)
    counted = 0

    def observe(count: int) -> None:
        nonlocal counted
        counted += count
        long_run.observe(counted)
        if on_tokens is not None:
            on_tokens(count)

    return observe


def untrained_drafter(
    target, drafter: DFlashDraftModel | None, block_size: int, mask_token_id: int | None, tokenizer, seed: int
) -> DFlashDraftModel:
    """A drafter with random weights (seeded, as training starts from): of `drafter`'s config, or
    without one of the default config for `target` (`block_size`, `mask_token_id` else the mask
    token chosen from the target as train chooses it)."""
    if drafter is not None:
        config = drafter.config
    else:
        choice = None
        if mask_token_id is None and tokenizer is not None:
            choice = choose_mask_token(tokenizer, target.get_input_embeddings().num_embeddings)
            mask_token_id = choice.token_id
        if mask_token_id is None:
            raise InputError(
                "--baseline untrained without --drafter: no tokenizer to choose a mask token from; pass --mask-token-id")
        try:
            config = build_drafter_config(target.config, block_size=block_size, mask_token_id=mask_token_id)
        except ValueError as error:
            raise InputError(f"--baseline untrained: {error}") from None
        if choice is not None:  # as train records it (a target with no spare id: a drafter mask embedding)
            config.dflash_config = {**config.dflash_config, **choice.record()}
    from draftsmith.model.io import drafter_class

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return drafter_class(config)(config)


def _load_target(path: str | Path, tokenizer, device: str | torch.device, dtype: torch.dtype):
    """(target, tokenizer) from a model directory, through the one target loader: a bad config.json
    or generation_config.json or an unreadable weights file is one line naming the file."""
    from transformers import AutoTokenizer

    target_path = Path(path)
    target = load_target_model(target_path, device, dtype)  # checks the directory first, as --target
    try:
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(target_path)
    except (OSError, ValueError, json.JSONDecodeError) as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise InputError(f"{target_path}: the target's tokenizer does not load ({first_line})") from None
    return target, tokenizer


def _encode_prompts(items: Sequence[Any], tokenizer, enable_thinking: bool | None) -> list[tuple[str, list[int]]]:
    """(id, prompt token ids) per prompt: rows and `Prompt`s through the chat template, id lists as they are."""
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
    return encoded


@dataclass
class _Tally:
    """One draft method's per-prompt results and running totals."""

    method: str
    results: list[PromptResult] = field(default_factory=list)
    histogram: Counter = field(default_factory=Counter)
    accepted_at: list[int] = field(default_factory=list)  # cycles whose draft at position k+1 matched
    raw_accepted: int = 0
    spec_tokens: int = 0
    spec_seconds: float = 0.0

    def add(self, spec: DecodeResult, block: int) -> None:
        if not self.accepted_at:
            self.accepted_at = [0] * (block - 1)
        self.histogram.update(spec.acceptance_lengths)
        self.raw_accepted += sum(spec.accepted_drafts)
        for count in spec.accepted_drafts:
            for position in range(count):
                self.accepted_at[position] += 1
        self.spec_tokens += len(spec.tokens)
        self.spec_seconds += spec.seconds


@dataclass
class _Run:
    """One eval: decodes each prompt plainly once and with every draft method, checks greedy output
    against the plain one, and tallies one report per method."""

    target: Any
    stops: list[int]
    block: int
    max_new_tokens: int
    temperature: float
    seed: int
    tolerance: float
    drafters: dict[str, DFlashDraftModel]
    ngram: tuple[int, int]  # (max, min) n-gram size of prompt lookup
    methods: list[str]
    on_tokens: Callable[[int], None] | None = None  # told of the tokens each decoder commits (progress)
    tallies: dict[str, _Tally] = field(default_factory=dict)
    target_tokens: int = 0
    target_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.tallies = {method: _Tally(method) for method in self.methods}

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def _speculative(self, method: str, input_ids: torch.Tensor, max_new_tokens: int, generator=None,
                     on_tokens: Callable[[int], None] | None = None) -> DecodeResult:
        sampling = {"temperature": self.temperature, "generator": generator} if self.temperature > 0 else {}
        if method == "ngram":
            return prompt_lookup_decode(self.target, input_ids, max_new_tokens, self.stops, self.block,
                                        max_ngram=self.ngram[0], min_ngram=self.ngram[1], **sampling,
                                        on_tokens=on_tokens)
        return speculative_decode(self.target, self.drafters[method], input_ids, max_new_tokens, self.stops,
                                  self.block, **sampling, on_tokens=on_tokens)

    def warm_up(self, ids: list[int]) -> None:
        """One short untimed pass of each decoder so first-call allocation does not skew the timings."""
        warm = torch.tensor([ids], device=self.device)
        greedy_decode(self.target, warm, min(4, self.max_new_tokens), self.stops)
        for method in self.methods:
            self._speculative(method, warm, min(4, self.max_new_tokens))

    def _generator(self, index: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(self.seed + index)

    def prompt(self, prompt_id: str, ids: list[int], index: int) -> None:
        input_ids = torch.tensor([ids], device=self.device)
        sampling = self.temperature > 0
        if sampling:
            plain = sample_decode(self.target, input_ids, self.max_new_tokens, self.stops, self.temperature,
                                  self._generator(index), on_tokens=self.on_tokens)
        else:
            plain = greedy_decode(self.target, input_ids, self.max_new_tokens, self.stops, on_tokens=self.on_tokens)
        self.target_tokens += len(plain.tokens)
        self.target_seconds += plain.seconds
        for method in self.methods:
            near_ties: list[int] = []
            spec = self._speculative(method, input_ids, self.max_new_tokens, self._generator(index) if sampling else None,
                                     self.on_tokens)
            if sampling:
                mismatch = _first_mismatch(plain.tokens, spec.tokens)  # reported, but expected at T > 0
            else:
                mismatch, near_ties = check_greedy(
                    self.target, input_ids, plain, spec.tokens, self.max_new_tokens, self.stops, self.tolerance
                )
            tally = self.tallies[method]
            verify = self._verify_size(method)
            tally.add(spec, verify)
            cycles = len(spec.acceptance_lengths)
            tally.results.append(PromptResult(
                id=prompt_id, prompt_tokens=len(ids), new_tokens=len(spec.tokens), cycles=cycles,
                # The first token comes from prefill, not from a cycle.
                tau=(sum(spec.acceptance_lengths) / cycles) if cycles else 0.0,
                speculative_seconds=spec.seconds, target_seconds=plain.seconds,
                identical=mismatch is None, first_mismatch=mismatch, near_ties=near_ties,
                accepted_per_position=[sum(1 for count in spec.accepted_drafts if count > k) for k in range(verify - 1)],
            ))

    def _verify_size(self, method: str) -> int:
        """Tokens the target verifies per cycle: the block (B-1 drafts), or B+1 for a DSpark drafter's B drafts."""
        drafter = self.drafters.get(method)
        return self.block + 1 if drafter is not None and drafter.predicts_from_anchor else self.block

    def report(self) -> EvalReport:
        first, *rest = [self._method_report(self.tallies[method]) for method in self.methods]
        first.baselines = rest
        return first

    def _method_report(self, tally: _Tally) -> EvalReport:
        sampling = self.temperature > 0
        total_cycles = sum(tally.histogram.values())
        mismatched = [] if sampling else [r.id for r in tally.results if not r.identical]
        spec_rate = tally.spec_tokens / tally.spec_seconds if tally.spec_seconds else 0.0
        target_rate = self.target_tokens / self.target_seconds if self.target_seconds else 0.0
        first = next(self.target.parameters())
        verify = self._verify_size(tally.method)
        # The drafter's own variant names its report, and block_size is its block as exported and served
        # (plan speculation reads the method to price a DSpark drafter as one).
        from_anchor = verify != self.block
        return EvalReport(
            tau=(sum(k * v for k, v in tally.histogram.items()) / total_cycles) if total_cycles else 0.0,
            acceptance_histogram=dict(tally.histogram),
            block_size=self.block, verify_tokens=verify,
            num_prompts=len(tally.results),
            total_new_tokens=tally.spec_tokens,
            total_cycles=total_cycles,
            speculative_tokens_per_s=spec_rate,
            target_tokens_per_s=target_rate,
            speedup=spec_rate / target_rate if target_rate else 0.0,
            lossless=None if sampling else not mismatched,
            mismatched_prompts=mismatched,
            max_new_tokens=self.max_new_tokens,
            per_prompt=tally.results,
            temperature=self.temperature,
            per_position_acceptance=per_position_acceptance(tally.histogram, verify),
            # Counted like vLLM's /metrics: a draft that matched counts even past a stop token.
            tau_engine_counting=1 + tally.raw_accepted / total_cycles if total_cycles else 0.0,
            per_position_acceptance_engine_counting=[
                count / total_cycles if total_cycles else 0.0 for count in tally.accepted_at or [0] * (verify - 1)
            ],
            tie_tolerance=None if sampling else self.tolerance,
            near_ties=sum(len(r.near_ties) for r in tally.results),
            near_tie_prompts=[r.id for r in tally.results if r.near_ties],
            device=str(first.device),
            dtype=str(first.dtype).removeprefix("torch."),
            method="dspark" if tally.method == "dflash" and from_anchor else tally.method,
        )


def _mismatch_message(report: EvalReport) -> str:
    messages = []
    for method in report.not_lossless:
        details = ", ".join(
            f"{r.id} (first difference at new token {r.first_mismatch})" for r in method.per_prompt if not r.identical
        )
        messages.append(
            f"{'' if method.method in ('dflash', 'dspark') else method.method + ': '}speculative greedy output differs from "
            f"plain greedy target output for {len(method.mismatched_prompts)} of {method.num_prompts} prompts: {details}"
        )
    return "; ".join(messages)



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
    markov = getattr(drafter, "markov_head", None)
    if markov is not None and markov.markov_w1.num_embeddings != target_config.vocab_size:
        # The Markov table is indexed by the target's tokens: another vocabulary is an index error mid-decode.
        problems.append(f"the Markov head covers {markov.markov_w1.num_embeddings} tokens, the target's vocabulary "
                        f"{target_config.vocab_size}")
    if problems:
        raise InputError("drafter does not fit this target: " + "; ".join(problems))
