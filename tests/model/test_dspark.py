"""The DSpark drafter: the DFlash backbone plus the Markov and confidence heads, in vLLM's names."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.core.errors import InputError
from draftsmith.model import DFlashDraftModel, drafter_state_dict, expected_weight_names, load_drafter, save_drafter
from draftsmith.model.dspark import DSparkDraftModel, build_dspark_config


@pytest.fixture()
def dspark_config(tiny_drafter_config):
    return build_dspark_config(tiny_drafter_config, markov_rank=8, confidence_head=True)


def _randomised(model: DSparkDraftModel) -> DSparkDraftModel:
    with torch.no_grad():  # untrained W2 is zero; give the bias something to carry
        model.markov_head.markov_w2.weight.normal_(0, 0.5)
    return model


def test_dspark_is_the_dflash_backbone_plus_two_heads(tiny_drafter_config, dspark_config):
    torch.manual_seed(0)
    dflash = DFlashDraftModel(tiny_drafter_config)
    torch.manual_seed(0)
    dspark = DSparkDraftModel(dspark_config)
    assert isinstance(dspark, DFlashDraftModel) and dspark.predicts_from_anchor and not dflash.predicts_from_anchor
    # Same seed, same backbone: the DSpark variant only adds its heads.
    backbone = dflash.state_dict()
    for name, tensor in backbone.items():
        torch.testing.assert_close(dspark.state_dict()[name], tensor, rtol=0, atol=0)
    extra = set(drafter_state_dict(dspark)) - set(drafter_state_dict(dflash))
    assert extra == {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                     "confidence_head.proj.weight", "confidence_head.proj.bias"}
    vocab, hidden = dspark_config.vocab_size, dspark_config.hidden_size
    state = drafter_state_dict(dspark)
    assert tuple(state["markov_head.markov_w1.weight"].shape) == (vocab, 8)
    assert tuple(state["markov_head.markov_w2.weight"].shape) == (vocab, 8)
    assert tuple(state["confidence_head.proj.weight"].shape) == (1, hidden + 8)  # [h ; markov_w1[prev]]
    # The untrained bias is zero: training starts from the plain DFlash drafter.
    base = torch.randn(2, vocab)
    torch.testing.assert_close(dspark.markov_logits(base, dspark.markov_embed(torch.tensor([3, 4]))), base)


def test_markov_logits_are_base_plus_the_low_rank_transition_of_the_previous_token(dspark_config):
    model = _randomised(DSparkDraftModel(dspark_config))
    previous = torch.tensor([5, 9])
    base = torch.randn(2, dspark_config.vocab_size)
    w1, w2 = model.markov_head.markov_w1.weight, model.markov_head.markov_w2.weight
    expected = base + w1[previous] @ w2.T
    torch.testing.assert_close(model.markov_logits(base, model.markov_embed(previous)), expected)
    hidden = torch.randn(2, dspark_config.hidden_size)
    proj = model.confidence_head.proj
    logits = model.confidence(hidden, model.markov_embed(previous))
    torch.testing.assert_close(logits, (torch.cat([hidden, w1[previous]], -1) @ proj.weight.T + proj.bias).squeeze(-1))


@pytest.mark.parametrize("distinct", [3, 12])  # rows sharing few tokens (bias per token), or each its own (per row)
def test_markov_logits_shared_equal_each_rows_own_bias_and_its_gradients(dspark_config, distinct):
    torch.manual_seed(0)
    model = _randomised(DSparkDraftModel(dspark_config)).double()  # float64: sums in another order agree closely
    tokens = torch.randperm(dspark_config.vocab_size)[:distinct].sort().values
    inverse = torch.cat([torch.arange(distinct), torch.randint(0, distinct, (12 - distinct,))])
    base = torch.randn(12, dspark_config.vocab_size, dtype=torch.float64, requires_grad=True)
    heads = [model.markov_head.markov_w1.weight, model.markov_head.markov_w2.weight]
    ours = model.markov_logits_shared(base, model.markov_embed(tokens), inverse)
    reference = model.markov_logits(base, model.markov_embed(tokens[inverse]))
    torch.testing.assert_close(ours, reference)
    upstream = torch.randn_like(ours)
    for mine, theirs in zip(torch.autograd.grad(ours, [base, *heads], upstream),
                            torch.autograd.grad(reference, [base, *heads], upstream)):
        torch.testing.assert_close(mine, theirs)


def test_save_and_load_round_trip_in_vllms_config_keys(tmp_path, dspark_config):
    model = _randomised(DSparkDraftModel(dspark_config)).eval()
    save_drafter(model, tmp_path / "d")
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3DSparkModel"] and raw["model_type"] == "qwen3"
    assert raw["markov_rank"] == 8 and raw["draft_vocab_size"] == raw["vocab_size"]
    assert raw["enable_confidence_head"] is True and raw["confidence_head_with_markov"] is True
    assert raw["sample_from_anchor"] is True and raw["markov_head_type"] == "vanilla"
    loaded = load_drafter(tmp_path / "d")
    assert isinstance(loaded, DSparkDraftModel)
    for name, tensor in drafter_state_dict(model).items():
        torch.testing.assert_close(drafter_state_dict(loaded)[name], tensor, rtol=0, atol=0)
    assert set(drafter_state_dict(loaded)) == expected_weight_names(loaded.config)

    # Without the confidence head there is no confidence weight to ship.
    plain = DSparkDraftModel(build_dspark_config(dspark_config, markov_rank=8, confidence_head=False))
    assert plain.confidence_head is None and not any("confidence" in name for name in drafter_state_dict(plain))

    # A DSpark config that lost its rank is refused in one line.
    raw.pop("markov_rank")
    (tmp_path / "d" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match="needs an integer markov_rank"):
        load_drafter(tmp_path / "d")


def test_markov_rank_outside_the_vocabulary_is_refused(tiny_drafter_config):
    for rank in (0, tiny_drafter_config.vocab_size + 1):
        with pytest.raises(ValueError, match="markov_rank must be in 1.."):
            build_dspark_config(tiny_drafter_config, markov_rank=rank)


def test_the_default_markov_rank_is_256_within_the_vocabulary(tiny_drafter_config):
    from draftsmith.model.dspark import default_markov_rank

    assert default_markov_rank(151936) == default_markov_rank(256) == 256 and default_markov_rank(10) == 10
    assert build_dspark_config(tiny_drafter_config).markov_rank == min(256, tiny_drafter_config.vocab_size)
