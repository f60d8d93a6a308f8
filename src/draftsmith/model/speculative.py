"""KV-cached decoding of a target with and without a DFlash drafter: the loops `eval` measures
and the trainer runs at checkpoints (`train --eval-prompts`).

One cycle (batch 1, greedy): the drafter sees the target features of every committed token (its KV
cache holds the projected context; only the features of tokens committed since the last cycle are
fed in), drafts a block [last committed token, MASK x (B-1)] in ONE forward, the target verifies
the whole block in ONE forward on its KV cache, the longest prefix where draft == target argmax is
accepted, plus the target's own next token (the "bonus"); both KV caches are cropped back to the
committed length and the target features of the newly committed tokens become drafter context.

Greedy verification makes the output identical to plain greedy decoding of the target, up to
floating-point differences between a 1-token and a B-token forward (see `evaluate` for the check).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from draftsmith.data.turns import end_of_turn_ids
from draftsmith.model.drafter import DFlashDraftModel
from draftsmith.model.features import LayerFeatureTap, target_embed_tokens, target_lm_head


@dataclass
class DecodeResult:
    tokens: list[int]
    seconds: float
    acceptance_lengths: list[int] = field(default_factory=list)
    # Drafts matching the target per cycle, counted before cutting at a stop token, as vLLM counts.
    accepted_drafts: list[int] = field(default_factory=list)
    # greedy_decode: per new token, the target's top-1 minus top-2 logit and the top-2 token, which
    # tell a near-tie (a flip floating point can cause) from a real difference.
    margins: list[float] = field(default_factory=list)
    runners_up: list[int] = field(default_factory=list)


def stop_set(stop_token_ids: Sequence[int] | None) -> set[int]:
    return {int(t) for t in (stop_token_ids or [])}


def _new_cache(config) -> DynamicCache:
    # A sliding-window target (Gemma 3, Mistral v0.1) gets full-length layers: transformers' sliding
    # layers keep only the window and cannot be cropped back after rejected drafts. The window is
    # still applied, by the attention mask the model builds from positions.
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if "sliding_attention" in (getattr(text, "layer_types", None) or []) or getattr(text, "sliding_window", None):
        return DynamicCache()
    return DynamicCache(config=config)


def _cache_kwarg(model) -> str:
    # transformers 5.24 renamed the forward argument `past_key_values` to `cache`.
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def _crop(cache: DynamicCache, length: int) -> None:
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


@torch.inference_mode()
def greedy_decode(
    target, input_ids: torch.Tensor, max_new_tokens: int, stop_token_ids: Sequence[int] | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> DecodeResult:
    """Plain greedy decoding with a KV cache, one target forward per token (the baseline).

    Besides the tokens it records each step's top-2 logit margin and runner-up (`margins`,
    `runners_up`) for the losslessness check. `on_tokens(n)` is told of every n tokens committed
    (a progress display; every decoder here takes one).
    """
    margins: list[float] = []
    runners_up: list[int] = []

    def choose(logits: torch.Tensor) -> int:
        values, indices = logits.float().topk(2)
        token, first, second = torch.stack([logits.argmax(), indices[0], indices[1]]).tolist()
        margins.append(float(values[0] - values[1]))
        runners_up.append(second if token == first else first)  # an exact tie: argmax took the other one
        return token

    result = _plain_decode(target, input_ids, max_new_tokens, stop_token_ids, choose, on_tokens)
    result.margins, result.runners_up = margins, runners_up
    return result


def _plain_decode(
    target, input_ids: torch.Tensor, max_new_tokens: int, stop_token_ids: Sequence[int] | None,
    choose: Callable[[torch.Tensor], int], on_tokens: Callable[[int], None] | None = None,
) -> DecodeResult:
    """One target forward per token with a KV cache; `choose` turns the last logits into the token."""
    stops = stop_set(stop_token_ids)
    started = time.perf_counter()
    cache = _new_cache(target.config)
    cache_kwarg = _cache_kwarg(target)
    prompt_len = input_ids.shape[1]
    output = target(input_ids, use_cache=True, logits_to_keep=1, **{cache_kwarg: cache})
    tokens: list[int] = []
    while True:
        tokens.append(choose(output.logits[0, -1]))
        if on_tokens is not None:
            on_tokens(1)
        if tokens[-1] in stops or len(tokens) >= max_new_tokens:
            break
        position = torch.tensor([[prompt_len + len(tokens) - 1]], device=input_ids.device)
        output = target(
            torch.tensor([[tokens[-1]]], device=input_ids.device), position_ids=position, use_cache=True,
            **{cache_kwarg: cache},
        )
    return DecodeResult(tokens, time.perf_counter() - started)


def accept_probability(p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """Speculative sampling's acceptance rule: keep draft x with probability min(1, p(x) / q(x))."""
    return torch.clamp(p_draft / q_draft.clamp_min(torch.finfo(q_draft.dtype).tiny), max=1.0)


def _residual_sample(p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None) -> int:
    # After a rejection the token comes from norm(max(0, p - q)), which makes the overall output
    # distribution exactly p. All mass in q below p can only vanish when p == q (then any p-sample does).
    residual = (p - q).clamp_min(0)
    total = residual.sum()
    weights = residual / total if total > 0 else p
    return int(torch.multinomial(weights, 1, generator=generator))


def _sample(probabilities: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probabilities, 1, generator=generator))


@torch.inference_mode()
def sample_decode(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    stop_token_ids: Sequence[int] | None = None,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> DecodeResult:
    """Plain sampling at `temperature` with a KV cache (the baseline for speculative sampling)."""
    return _plain_decode(
        target, input_ids, max_new_tokens, stop_token_ids,
        lambda logits: _sample(torch.softmax(logits.float() / temperature, -1), generator), on_tokens,
    )


@torch.inference_mode()
def speculative_decode(
    target,
    drafter: DFlashDraftModel,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    stop_token_ids: Sequence[int] | None = None,
    block_size: int | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    accept_rule: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = accept_probability,
    on_tokens: Callable[[int], None] | None = None,
) -> DecodeResult:
    """DFlash speculative decoding; `acceptance_lengths` holds tokens committed per cycle.

    `temperature` 0 verifies greedily (output identical to `greedy_decode`). Above 0 it is
    speculative sampling: the drafter samples each draft token x from q = softmax(its logits / T),
    the target keeps it with probability `accept_rule(p(x), q(x))` (min(1, p/q)), on the first
    rejection resamples from norm(max(0, p - q)), and after a fully accepted block samples the bonus
    token from p; the output is then distributed exactly as `sample_decode` at the same T.
    """
    if input_ids.shape[0] != 1:
        raise ValueError(f"speculative_decode runs one sequence at a time; got a batch of {input_ids.shape[0]}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    stops = stop_set(stop_token_ids)
    block_size = int(block_size or drafter.block_size)
    embed = target_embed_tokens(target)
    lm_head = target_lm_head(target)
    device = input_ids.device
    sampling = temperature > 0

    def probabilities(logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float() / temperature, -1)

    started = time.perf_counter()
    target_cache = _new_cache(target.config)
    drafter_cache = _new_cache(drafter.config)
    cache_kwarg = _cache_kwarg(target)
    prompt_len = input_ids.shape[1]
    acceptance_lengths: list[int] = []
    accepted_drafts: list[int] = []
    with LayerFeatureTap(target, drafter.target_layer_ids) as tap:
        output = target(input_ids, use_cache=True, logits_to_keep=1, **{cache_kwarg: target_cache})
        first = output.logits[0, -1]
        tokens = [_sample(probabilities(first), generator) if sampling else int(first.argmax())]
        if on_tokens is not None:
            on_tokens(1)
        pending_context = tap.take()  # target features not yet in the drafter's cache

        # Drafts per cycle: B-1 from a DFlash block; B from a DSpark one (each position predicts the next token).
        max_drafts = block_size if drafter.predicts_from_anchor else block_size - 1
        while tokens[-1] not in stops and len(tokens) < max_new_tokens:
            anchor_position = prompt_len + len(tokens) - 1  # == committed length in the target cache
            verify_size = 1 + min(max_drafts, max_new_tokens - len(tokens) - 1)
            block = torch.full((1, verify_size), drafter.mask_token_id, dtype=torch.long, device=device)
            block[0, 0] = tokens[-1]
            draft_probs = None
            if verify_size > 1:
                draft_probs = _draft_into(
                    drafter, block, pending_context, anchor_position, drafter_cache, embed, lm_head,
                    probabilities if sampling else None, generator,
                )

            new_tokens, accepted = _verify_and_commit(
                target, target_cache, block, anchor_position, draft_probs,
                probabilities if sampling else None, generator, accept_rule, stops,
            )  # fmt: skip
            tokens.extend(new_tokens)
            if on_tokens is not None:
                on_tokens(len(new_tokens))
            acceptance_lengths.append(len(new_tokens))
            accepted_drafts.append(accepted)
            pending_context = tap.take()[:, : accepted + 1]
    return DecodeResult(tokens[:max_new_tokens], time.perf_counter() - started, acceptance_lengths, accepted_drafts)


def prompt_lookup_drafts(context: Sequence[int], num_drafts: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Prompt-lookup (n-gram) drafts: the tokens that followed the earliest earlier occurrence of the
    context's last n tokens, n from `max_ngram` down to `min_ngram`; [] when nothing matches.

    The classic rule (Saxena's prompt-lookup decoding, transformers' `prompt_lookup_num_tokens`):
    the context is the prompt plus everything generated so far, and a longer match wins.
    """
    length = len(context)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = list(context[length - n:])
        first = tail[0]
        for start in range(length - n):
            if context[start] == first and list(context[start:start + n]) == tail:
                return list(context[start + n: start + n + num_drafts])
    return []


@torch.inference_mode()
def prompt_lookup_decode(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    stop_token_ids: Sequence[int] | None = None,
    block_size: int = 16,
    max_ngram: int = 3,
    min_ngram: int = 1,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> DecodeResult:
    """Speculative decoding with prompt-lookup drafts instead of a drafter: the baseline a DFlash
    drafter must beat. Cycles, `acceptance_lengths` and verification are `speculative_decode`'s:
    the target verifies [last token, up to B-1 drafts] in one forward; a cycle without a match
    verifies the last token alone and commits one token. Above temperature 0 the drafts are
    deterministic (q is one-hot), so speculative sampling keeps a draft x with probability p(x).
    """
    if input_ids.shape[0] != 1:
        raise ValueError(f"prompt_lookup_decode runs one sequence at a time; got a batch of {input_ids.shape[0]}")
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
    stops = stop_set(stop_token_ids)
    device = input_ids.device
    sampling = temperature > 0

    def probabilities(logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float() / temperature, -1)

    started = time.perf_counter()
    cache = _new_cache(target.config)
    cache_kwarg = _cache_kwarg(target)
    prompt_len = input_ids.shape[1]
    output = target(input_ids, use_cache=True, logits_to_keep=1, **{cache_kwarg: cache})
    first = output.logits[0, -1]
    vocab_size = first.shape[-1]
    tokens = [_sample(probabilities(first), generator) if sampling else int(first.argmax())]
    if on_tokens is not None:
        on_tokens(1)
    context = input_ids[0].tolist() + tokens
    acceptance_lengths: list[int] = []
    accepted_drafts: list[int] = []
    while tokens[-1] not in stops and len(tokens) < max_new_tokens:
        anchor_position = prompt_len + len(tokens) - 1
        room = min(block_size, max_new_tokens - len(tokens)) - 1
        drafts = prompt_lookup_drafts(context, room, max_ngram, min_ngram) if room > 0 else []
        block = torch.tensor([[tokens[-1], *drafts]], device=device)
        # Deterministic drafts: q is one-hot, so speculative sampling keeps a draft x with probability p(x).
        draft_probs = torch.nn.functional.one_hot(block[0, 1:], vocab_size).float() if sampling else None
        new_tokens, accepted = _verify_and_commit(
            target, cache, block, anchor_position, draft_probs,
            probabilities if sampling else None, generator, accept_probability, stops,
        )  # fmt: skip
        tokens.extend(new_tokens)
        if on_tokens is not None:
            on_tokens(len(new_tokens))
        context.extend(new_tokens)
        acceptance_lengths.append(len(new_tokens))
        accepted_drafts.append(accepted)
    return DecodeResult(tokens[:max_new_tokens], time.perf_counter() - started, acceptance_lengths, accepted_drafts)


def _verify_and_commit(target, cache, block, anchor_position, draft_probs, probabilities, generator, accept_rule, stops):
    """(committed tokens, accepted drafts) of one cycle: the target verifies block = [anchor, drafts]
    in one forward, greedily or (with `probabilities`) by speculative sampling against `draft_probs`;
    the accepted drafts plus the target's next token are committed (cut after a stop token), and the
    cache is cropped to the anchor and the accepted drafts, the positions that now hold valid KV."""
    output = target(
        block,
        position_ids=torch.arange(anchor_position, anchor_position + block.shape[1], device=block.device).unsqueeze(0),
        use_cache=True,
        **{_cache_kwarg(target): cache},
    )
    if probabilities is not None:
        accepted, next_token = _verify_sampled(block[0, 1:], draft_probs, probabilities(output.logits[0]), generator, accept_rule)
    else:
        accepted, next_token = _verify_greedy(block[0, 1:], output.logits[0])
    _crop(cache, anchor_position + accepted + 1)
    return _cut_at_stop(block[0, 1 : accepted + 1].tolist() + [next_token], stops), accepted


def _draft_into(drafter, block, context, anchor_position, drafter_cache, embed, lm_head, probabilities, generator):
    """Fill block[0, 1:] with the drafter's tokens in one forward over [new context, block].

    The drafter's cache keeps the context keys and drops the block's. Returns the draft
    distributions q when sampling (`probabilities` given), else None (greedy argmax drafts).
    """
    dtype = drafter.fc.weight.dtype
    # DSpark's queries are [anchor, MASK x (N-1)] for N drafts; DFlash's are the whole block.
    query = block[:, :-1] if drafter.predicts_from_anchor else block
    positions = torch.arange(anchor_position - context.shape[1], anchor_position + query.shape[1], device=block.device)
    hidden = drafter(
        position_ids=positions.unsqueeze(0),
        noise_embedding=embed(query).to(dtype),
        target_hidden=context.to(dtype),
        block_ids=query,
        past_key_values=drafter_cache,
        use_cache=True,
    )
    _crop(drafter_cache, anchor_position)
    if drafter.predicts_from_anchor:
        return _draft_markov(drafter, hidden, block, lm_head, probabilities, generator)
    draft_logits = drafter.compute_logits(hidden[:, 1:].to(lm_head.weight.dtype), lm_head)[0]
    if probabilities is None:
        block[0, 1:] = draft_logits.argmax(-1)
        return None
    draft_probs = probabilities(draft_logits)
    block[0, 1:] = torch.multinomial(draft_probs, 1, generator=generator)[:, 0]
    return draft_probs


def _draft_markov(drafter, hidden, block, lm_head, probabilities, generator):
    """DSpark's sequential stage, as vLLM's `DSparkSpeculator._sample_sequential`: base logits of
    every position from one parallel pass, then left to right logits_i = base_i + markov_bias(prev),
    prev = the anchor, then each token just drafted; greedy argmax, or a sample from
    softmax(logits_i / T) whose distribution is returned for verification."""
    base_logits = drafter.compute_logits(hidden[0].to(lm_head.weight.dtype), lm_head)
    previous = block[0, :1]
    draft_probs = []
    for i in range(base_logits.shape[0]):
        logits = drafter.markov_logits(base_logits[i : i + 1], drafter.markov_embed(previous))[0]
        if probabilities is None:
            block[0, i + 1] = logits.argmax(-1)
        else:
            draft_probs.append(probabilities(logits))
            block[0, i + 1] = torch.multinomial(draft_probs[-1], 1, generator=generator)[0]
        previous = block[0, i + 1 : i + 2]
    return torch.stack(draft_probs) if draft_probs else None


def _verify_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """(accepted drafts, the token after them): the longest prefix equal to the target's argmax."""
    predicted = target_logits.argmax(-1)
    matches = (drafts == predicted[:-1]).int()
    accepted = int(matches.cumprod(0).sum()) if matches.numel() else 0
    return accepted, int(predicted[accepted])


def _cut_at_stop(tokens: list[int], stops: set[int]) -> list[int]:
    for index, token in enumerate(tokens):
        if token in stops:
            return tokens[: index + 1]
    return tokens


def _verify_sampled(drafts, draft_probs, target_probs, generator, accept_rule) -> tuple[int, int]:
    """(accepted drafts, the token after them) under speculative sampling; target_probs[j] scores drafts[j]."""
    for j, token in enumerate(drafts.tolist()):
        p, q = target_probs[j], draft_probs[j]
        keep = float(accept_rule(p[token], q[token]))
        if torch.rand((), generator=generator, device=p.device).item() >= keep:
            return j, _residual_sample(p, q, generator)
    return len(drafts), _sample(target_probs[len(drafts)], generator)


def default_stop_token_ids(target, tokenizer=None) -> list[int]:
    """The target's end-of-turn ids: with a tokenizer, the one its chat template ends a turn with
    (Gemma's <end_of_turn>, which a GGUF's eos is not), then generation_config's eos ids and the
    tokenizer's (data.turns); without one, generation_config's alone."""
    eos = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    if tokenizer is not None:
        return end_of_turn_ids(tokenizer, eos)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(t) for t in eos]
