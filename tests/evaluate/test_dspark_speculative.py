"""In-process DSpark speculative decoding: the block drafted left to right through the Markov head
(as vLLM's `DSparkSpeculator._sample_sequential`), greedy output identical to the target's and
sampled output distributed as plain sampling."""

from __future__ import annotations

import json

import pytest
import torch
from test_sampling import (
    ALPHA, SAMPLES, TEMPERATURE, _plain_samples, always_accept, chi_square_homogeneity,
)

from draftsmith.evaluate import accept_probability, evaluate_drafter, greedy_decode, speculative_decode
from draftsmith.model import build_drafter_config
from draftsmith.model.dspark import DSparkDraftModel, build_dspark_config
from draftsmith.model.speculative import _draft_markov
from draftsmith.tiny import synthetic_prompts

RANK = 8


def dspark_config(target, block_size: int, confidence_head: bool = True):
    base = build_drafter_config(target.config, num_draft_layers=1, block_size=block_size, mask_token_id=3)
    return build_dspark_config(base, markov_rank=RANK, confidence_head=confidence_head)


def successor_chain(model: DSparkDraftModel, strength: float = 50.0) -> DSparkDraftModel:
    """Markov weights whose bias after token t is +strength at token t+1 (mod V), and 0 elsewhere."""
    vocab = model.config.vocab_size
    codes = torch.randn(vocab, RANK)
    codes = codes / codes.norm(dim=-1, keepdim=True)
    with torch.no_grad():
        model.markov_head.markov_w1.weight.copy_(codes)
        model.markov_head.markov_w2.weight.copy_(strength * codes.roll(1, dims=0))  # row t+1 = code of t
    return model


class ZeroBase(DSparkDraftModel):
    """The real drafter forward with flat base logits: every draft is the Markov head's choice."""

    def compute_logits(self, hidden, lm_head):
        return torch.zeros(*hidden.shape[:-1], lm_head.weight.shape[0])


@pytest.fixture(scope="module")
def prompt_ids(tiny_tokenizer):
    row = next(iter(synthetic_prompts(1, seed=5)))
    text = tiny_tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
    return torch.tensor([tiny_tokenizer(text, add_special_tokens=False)["input_ids"]])


def test_drafts_are_sampled_left_to_right_from_the_token_just_drafted(target):
    torch.manual_seed(0)
    model = successor_chain(ZeroBase(dspark_config(target, 5))).eval()
    # codes @ codes.T peaks on the diagonal: the chain's own successor wins by a wide margin.
    block = torch.tensor([[7, 3, 3, 3, 3, 3]])
    hidden = torch.zeros(1, 5, model.config.hidden_size)
    assert _draft_markov(model, hidden, block, target.lm_head, None, None) is None
    # A parallel drafter conditioned on the anchor alone would draft 8 at every position.
    assert block[0].tolist() == [7, 8, 9, 10, 11, 12]

    # Sampling: each position's q is softmax((base + bias(prev)) / T) of the token drafted before it.
    block = torch.tensor([[7, 3, 3, 3, 3, 3]])
    probs = _draft_markov(model, hidden, block, target.lm_head, lambda logits: torch.softmax(logits / 2.0, -1),
                          torch.Generator().manual_seed(1))
    assert probs.shape == (5, model.config.vocab_size)
    for i in range(5):
        previous = block[0, i : i + 1]
        expected = torch.softmax(model.markov_logits(torch.zeros(1, model.config.vocab_size), model.markov_embed(previous))[0] / 2.0, -1)
        torch.testing.assert_close(probs[i], expected)


def test_dspark_block_of_b_queries_drafts_b_tokens_and_greedy_is_lossless(target, tiny_tokenizer, prompt_ids, tmp_path):
    torch.manual_seed(0)
    model = successor_chain(DSparkDraftModel(dspark_config(target, 4)), strength=2.0).eval()
    plain = greedy_decode(target, prompt_ids, 40, [tiny_tokenizer.eos_token_id])
    spec = speculative_decode(target, model, prompt_ids, 40, [tiny_tokenizer.eos_token_id])
    assert spec.tokens == plain.tokens
    assert max(spec.acceptance_lengths) <= 5  # 4 drafts + the target's token

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(3, seed=11)))
    report = evaluate_drafter(target, model, prompts, max_new_tokens=32, tokenizer=tiny_tokenizer, baselines=("untrained",))
    assert report.lossless and report.block_size == 4 and report.verify_tokens == 5 and report.method == "dspark"
    assert len(report.per_position_acceptance_engine_counting) == 4  # block 4: drafts at positions 1..4
    assert report.baselines[0].lossless and report.baselines[0].method == "untrained"


class FixedProposalDSpark(DSparkDraftModel):
    """Base logits a fixed proposal at every position, plus the real Markov bias of the previous token."""

    def __init__(self, config, proposal: torch.Tensor):
        super().__init__(config)
        self.proposal_logits = TEMPERATURE * proposal.clamp_min(1e-12).log()

    def compute_logits(self, hidden, lm_head):
        return self.proposal_logits.expand(*hidden.shape[:-1], -1)


def _samples(target, drafter, prompt_ids, count: int, seed: int, rule) -> tuple[list[tuple[int, ...]], float]:
    generator = torch.Generator().manual_seed(seed)
    samples, accepted, drafted = [], 0, 0
    for _ in range(count):
        result = speculative_decode(target, drafter, prompt_ids, 4, [], block_size=2, temperature=TEMPERATURE,
                                    generator=generator, accept_rule=rule)
        samples.append(tuple(result.tokens))
        accepted += sum(result.accepted_drafts)
        drafted += 2 * len(result.acceptance_lengths)
    return samples, accepted / drafted


@pytest.mark.slow
def test_dspark_speculative_sampling_matches_plain_sampling(target, prompt_ids, capsys):
    torch.manual_seed(0)
    pilot = [token for sample in _plain_samples(target, prompt_ids, 200, seed=9) for token in sample[1:]]
    vocab = target.config.vocab_size
    proposal = torch.full((vocab,), 0.3 / vocab)
    for token in pilot:
        proposal[token] += 0.7 / len(pilot)
    drafter = FixedProposalDSpark(dspark_config(target, 2), proposal).eval()
    with torch.no_grad():  # a Markov bias strong enough that q depends on the token drafted before
        drafter.markov_head.markov_w2.weight.normal_(0, 0.5)
        drafter.markov_head.markov_w1.weight.normal_(0, 0.5)
    plain = _plain_samples(target, prompt_ids, SAMPLES, seed=1)
    correct, acceptance = _samples(target, drafter, prompt_ids, SAMPLES, seed=2, rule=accept_probability)
    broken, _ = _samples(target, drafter, prompt_ids, SAMPLES, seed=3, rule=always_accept)
    good_stat, good_dof, good_p = chi_square_homogeneity(plain, correct)
    bad_stat, _, bad_p = chi_square_homogeneity(plain, broken)
    with capsys.disabled():
        print(f"\nDSpark speculative sampling, {SAMPLES} samples, acceptance {acceptance:.2f}: correct chi2 {good_stat:.1f} "
              f"(dof {good_dof}, p {good_p:.3g}); always-accept chi2 {bad_stat:.1f} (p {bad_p:.3g})")
    assert 0.03 < acceptance < 0.97
    assert good_p > ALPHA, f"DSpark speculative sampling differs from plain sampling: chi2 {good_stat:.1f}, p {good_p:.3g}"
    assert bad_p < ALPHA
