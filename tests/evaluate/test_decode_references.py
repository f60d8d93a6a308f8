"""The plain decoders the eval measures against, checked against independent references:
greedy_decode against transformers' own `generate`, sample_decode by seed and by distribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from draftsmith.model.speculative import greedy_decode, sample_decode
from draftsmith.tiny import synthetic_prompts


def _prompt(tokenizer, seed: int) -> torch.Tensor:
    row = next(iter(synthetic_prompts(1, seed=seed)))
    text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


@pytest.mark.parametrize("seed", [5, 11])
def test_greedy_decode_equals_transformers_generate(target, tiny_tokenizer, seed):
    input_ids = _prompt(tiny_tokenizer, seed)
    eos = tiny_tokenizer.eos_token_id
    for max_new_tokens, stops in ((48, [eos]), (30, [])):
        ours = greedy_decode(target, input_ids, max_new_tokens, stops)
        theirs = target.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=stops[0] if stops else None, pad_token_id=eos,
            **({} if stops else {"min_new_tokens": max_new_tokens}),
        )[0, input_ids.shape[1]:].tolist()
        assert ours.tokens == theirs, (max_new_tokens, stops)
        assert len(ours.margins) == len(ours.runners_up) == len(ours.tokens)
        assert all(margin >= 0 for margin in ours.margins)
        assert all(runner != token for runner, token in zip(ours.runners_up, ours.tokens))
    assert ours.tokens and len(ours.tokens) == 30  # no stop: the whole budget


def test_sample_decode_is_seeded(target, tiny_tokenizer):
    input_ids = _prompt(tiny_tokenizer, 5)

    def draw(seed):
        return sample_decode(target, input_ids, 24, [], temperature=1.5, generator=torch.Generator().manual_seed(seed)).tokens

    first = draw(7)
    assert len(first) == 24 and draw(7) == first
    assert any(draw(seed) != first for seed in (8, 9, 10))


def _chi_square_p(counts: Counter, probabilities: torch.Tensor, draws: int) -> float:
    """p-value of counts against the exact law, cells with expected count < 5 pooled into one."""
    expected = probabilities * draws
    big = (expected >= 5).nonzero().flatten().tolist()
    observed = [counts.get(token, 0) for token in big]
    rest_observed = draws - sum(observed)
    rest_expected = draws - float(expected[big].sum())
    stat = sum((o - float(expected[t])) ** 2 / float(expected[t]) for o, t in zip(observed, big))
    cells = len(big)
    if rest_expected >= 5:
        stat += (rest_observed - rest_expected) ** 2 / rest_expected
        cells += 1
    dof = max(1, cells - 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_sample_decode_draws_from_the_tempered_target(target, tiny_tokenizer):
    # The first token of each draw against softmax(logits / T) computed here from one plain forward;
    # a 4-token draw also passes through the KV-cached steps, whose tokens must stay in the vocabulary.
    input_ids = _prompt(tiny_tokenizer, 11)
    temperature, draws = 1.5, 400
    with torch.inference_mode():
        logits = target(input_ids).logits[0, -1].float()
    generator = torch.Generator().manual_seed(0)
    counts: Counter = Counter()
    for _ in range(draws):
        tokens = sample_decode(target, input_ids, 4, [], temperature=temperature, generator=generator).tokens
        assert len(tokens) == 4 and all(0 <= t < logits.numel() for t in tokens)
        counts[tokens[0]] += 1
    right = _chi_square_p(counts, torch.softmax(logits / temperature, -1), draws)
    wrong = _chi_square_p(counts, torch.softmax(logits / 0.5, -1), draws)  # the test can tell T apart
    assert right > 1e-3, f"sample_decode's first token does not follow softmax(logits / T): p {right:.3g}"
    assert wrong < 1e-6, f"a different temperature fits as well: p {wrong:.3g}"
