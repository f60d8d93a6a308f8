"""Speculative sampling is lossless in distribution: same token law as plain sampling at T.

Each side draws N seeded samples of the first new tokens after a fixed prompt. A chi-square test
of homogeneity compares the two samples of the joint (t1, t2, t3) outcome, with outcomes seen fewer
than MIN_COUNT times in both samples together pooled into one category (the usual validity rule:
expected counts >= 5 per cell). At significance ALPHA the correct rule must pass; a deliberately
broken rule (always accept the draft) must fail, so the test can tell them apart.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from draftsmith.evaluate import accept_probability, speculative_decode
from draftsmith.model import DFlashDraftModel, build_drafter_config
from draftsmith.tiny import synthetic_prompts

TEMPERATURE = 1.5
SAMPLES = 600
NEW_TOKENS = 4  # t0 comes from prefill on both sides; t1..t3 from one draft/verify cycle (2 drafts + 1)
MIN_COUNT = 10
ALPHA = 1e-3


class FixedProposalDrafter(DFlashDraftModel):
    """A real drafter forward whose proposal is a fixed distribution q at every block position.

    Speculative sampling is lossless for ANY proposal q; a q built from the target's pooled token
    frequencies (ignoring position) plus some uniform mass overlaps p often but not always, so both
    acceptance and residual resampling happen, and always-accepting visibly changes the output law.
    """

    def __init__(self, config, proposal: torch.Tensor):
        super().__init__(config)
        # speculative_decode takes q = softmax(logits / T): these logits give exactly `proposal`.
        self.proposal_logits = TEMPERATURE * proposal.clamp_min(1e-12).log()

    def compute_logits(self, hidden, lm_head):
        return self.proposal_logits.expand(hidden.shape[0], hidden.shape[1], -1)


@pytest.fixture(scope="module")
def prompt_ids(tiny_tokenizer):
    row = next(iter(synthetic_prompts(1, seed=5)))
    text = tiny_tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
    return torch.tensor([tiny_tokenizer(text, add_special_tokens=False)["input_ids"]])


@torch.inference_mode()
def _plain_samples(target, prompt_ids, count: int, seed: int) -> list[tuple[int, ...]]:
    """Independent reference: batched ancestral sampling with full forwards (no cache, no draftsmith code)."""
    generator = torch.Generator().manual_seed(seed)
    sequences = prompt_ids.expand(count, -1).clone()
    for _ in range(NEW_TOKENS):
        logits = target(sequences, use_cache=False).logits[:, -1].float()
        token = torch.multinomial(torch.softmax(logits / TEMPERATURE, -1), 1, generator=generator)
        sequences = torch.cat([sequences, token], dim=1)
    return [tuple(row) for row in sequences[:, prompt_ids.shape[1] :].tolist()]


def _speculative_samples(target, drafter, prompt_ids, count: int, seed: int, rule) -> tuple[list[tuple[int, ...]], float]:
    generator = torch.Generator().manual_seed(seed)
    samples, accepted, cycles = [], 0, 0
    for _ in range(count):
        result = speculative_decode(target, drafter, prompt_ids, NEW_TOKENS, [], block_size=4,
                                    temperature=TEMPERATURE, generator=generator, accept_rule=rule)
        samples.append(tuple(result.tokens))
        accepted += sum(length - 1 for length in result.acceptance_lengths)
        cycles += len(result.acceptance_lengths)
    return samples, accepted / (2 * cycles)


def chi_square_homogeneity(a: list, b: list) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) for 'a and b come from the same distribution'."""
    count_a, count_b = Counter(a), Counter(b)
    cells: dict = {}
    for outcome in set(count_a) | set(count_b):
        key = outcome if count_a[outcome] + count_b[outcome] >= MIN_COUNT else "pooled"
        pair = cells.setdefault(key, [0, 0])
        pair[0] += count_a[outcome]
        pair[1] += count_b[outcome]
    n_a, n_b = len(a), len(b)
    statistic = 0.0
    for in_a, in_b in cells.values():
        total = in_a + in_b
        for observed, n in ((in_a, n_a), (in_b, n_b)):
            expected = total * n / (n_a + n_b)
            statistic += (observed - expected) ** 2 / expected
    dof = len(cells) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return statistic, dof, p_value


def always_accept(p_draft, q_draft):
    return torch.ones_like(p_draft)


@pytest.mark.slow
def test_speculative_sampling_matches_plain_sampling_and_a_broken_rule_does_not(target, prompt_ids, capsys):
    torch.manual_seed(0)
    config = build_drafter_config(target.config, num_draft_layers=1, block_size=4, mask_token_id=3)
    pilot = Counter(token for sample in _plain_samples(target, prompt_ids, 200, seed=9) for token in sample[1:])
    vocab = target.config.vocab_size
    proposal = torch.full((vocab,), 0.3 / vocab)
    for token, count in pilot.items():
        proposal[token] += 0.7 * count / sum(pilot.values())
    drafter = FixedProposalDrafter(config, proposal).eval()
    plain = _plain_samples(target, prompt_ids, SAMPLES, seed=1)
    correct, acceptance = _speculative_samples(target, drafter, prompt_ids, SAMPLES, seed=2, rule=accept_probability)
    broken, _ = _speculative_samples(target, drafter, prompt_ids, SAMPLES, seed=3, rule=always_accept)

    good_stat, good_dof, good_p = chi_square_homogeneity(plain, correct)
    bad_stat, bad_dof, bad_p = chi_square_homogeneity(plain, broken)
    with capsys.disabled():
        print(f"\nspeculative sampling, {SAMPLES} samples each, draft acceptance {acceptance:.2f}: "
              f"correct rule chi2 {good_stat:.1f} (dof {good_dof}, p {good_p:.3g}); "
              f"always-accept chi2 {bad_stat:.1f} (dof {bad_dof}, p {bad_p:.3g})")
    # Both branches ran: about 2 * SAMPLES drafts, so even 3% is dozens of accepted and rejected ones.
    assert 0.03 < acceptance < 0.97
    assert good_p > ALPHA, f"speculative sampling differs from plain sampling: chi2 {good_stat:.1f}, p {good_p:.3g}"
    assert bad_p < ALPHA, f"the test cannot tell an always-accept rule apart: chi2 {bad_stat:.1f}, p {bad_p:.3g}"
