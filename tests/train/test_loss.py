import math

import pytest
import torch
import torch.nn.functional as F

from draftsmith.train.loss import default_gamma, dflash_loss, expected_weight_sum, position_weights


def test_position_weights_by_hand():
    weights = position_weights(16)
    assert weights.shape == (15,)
    assert weights[0].item() == pytest.approx(1.0)
    assert weights[1].item() == pytest.approx(math.exp(-1 / 7))
    assert weights[14].item() == pytest.approx(math.exp(-14 / 7))
    assert position_weights(4, gamma=2.0).tolist() == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0)])
    assert expected_weight_sum(16) == pytest.approx(float(weights.sum()), rel=1e-6)


def test_default_gamma_follows_the_paper():
    assert default_gamma(16) == 7
    assert default_gamma(10) == 5
    assert default_gamma(8) == 4
    assert default_gamma(4) == 1.5
    with pytest.raises(ValueError):
        position_weights(8, gamma=0)


def test_weighted_loss_normalisation_by_hand():
    # One block of size 4: three predictions over a vocabulary of 2.
    logits = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [3.0, 3.0]]])
    labels = torch.tensor([[0, 0, 1]])
    label_mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third label is masked (prompt / past the end)
    weights = torch.tensor([1.0, 0.5, 0.25])
    ce0 = -math.log(math.exp(2) / (math.exp(2) + 1))
    ce1 = -math.log(1 / (1 + math.exp(1)))
    expected = (1.0 * ce0 + 0.5 * ce1) / 1.5
    output = dflash_loss(logits, labels, label_mask, weights)
    assert output.loss.item() == pytest.approx(expected, rel=1e-6)
    assert output.weight_sum.item() == pytest.approx(1.5)
    assert output.correct.tolist() == [1.0, 0.0, 0.0]
    assert output.counted.tolist() == [1.0, 1.0, 0.0]
    assert output.accepted_prefix.item() == 1  # first right, second wrong
    assert output.blocks.item() == 1


def test_loss_is_normalised_over_all_blocks_and_sequences():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, 11)
    labels = torch.randint(0, 11, (2, 3, 5))
    label_mask = (torch.rand(2, 3, 5) > 0.3).float()
    weights = position_weights(6, gamma=2.0)
    ce = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), reduction="none").view(2, 3, 5)
    w = label_mask * weights
    expected = (ce * w).sum() / w.sum()
    assert dflash_loss(logits, labels, label_mask, weights).loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_masked_predictions_get_no_gradient():
    logits = torch.randn(1, 2, 3, 7, requires_grad=True)
    labels = torch.zeros(1, 2, 3, dtype=torch.long)
    label_mask = torch.tensor([[[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]])
    dflash_loss(logits, labels, label_mask, position_weights(4)).loss.backward()
    assert logits.grad[0, 0, 1].abs().sum() == 0
    assert logits.grad[0, 1].abs().sum() == 0
    assert logits.grad[0, 0, 0].abs().sum() > 0


def test_loss_from_hidden_scores_only_unmasked_predictions_and_matches():
    from draftsmith.train.loss import dflash_loss_from_hidden

    torch.manual_seed(1)
    head = torch.nn.Linear(8, 13, bias=False)
    hidden = torch.randn(2, 3, 5, 8, requires_grad=True)
    labels = torch.randint(0, 13, (2, 3, 5))
    label_mask = (torch.rand(2, 3, 5) > 0.4).float()
    label_mask[1, 2] = 0  # a padding block
    weights = position_weights(6)
    scored_rows = []

    def score(rows):
        scored_rows.append(rows.shape[0])
        return head(rows)

    fast = dflash_loss_from_hidden(hidden, score, labels, label_mask, weights)
    full = dflash_loss(head(hidden), labels, label_mask, weights)
    assert scored_rows == [int(label_mask.sum())]
    assert fast.loss.item() == pytest.approx(full.loss.item(), rel=1e-6)
    assert fast.correct.tolist() == full.correct.tolist()
    assert fast.accepted_prefix.item() == full.accepted_prefix.item()
    (grad_fast,) = torch.autograd.grad(fast.loss, hidden)
    (grad_full,) = torch.autograd.grad(full.loss, hidden)
    torch.testing.assert_close(grad_fast, grad_full)


def _loss_inputs(seed: int, vocab: int = 37, hidden_size: int = 12):
    torch.manual_seed(seed)
    head = torch.nn.Linear(hidden_size, vocab, bias=False).requires_grad_(False)
    hidden = torch.randn(3, 6, 7, hidden_size, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, vocab, (3, 6, 7))
    label_mask = (torch.rand(3, 6, 7) > 0.3).double()
    label_mask[2, 5] = 0  # a padding block
    return head.double(), hidden, labels, label_mask, position_weights(8).double()


@pytest.mark.parametrize("chunk_rows", [1, 5, 16, 1000])
def test_chunked_loss_equals_the_one_pass_loss_and_its_gradients(chunk_rows):
    from draftsmith.train.loss import dflash_loss_from_hidden

    head, hidden, labels, label_mask, weights = _loss_inputs(2)
    reference = dflash_loss_from_hidden(hidden, head, labels, label_mask, weights, chunk_rows=None)
    chunked = dflash_loss_from_hidden(hidden, head, labels, label_mask, weights, chunk_rows=chunk_rows)
    assert abs(chunked.loss.item() - reference.loss.item()) < 1e-6
    assert chunked.correct.tolist() == reference.correct.tolist()
    assert chunked.accepted_prefix.item() == reference.accepted_prefix.item()
    (grad_reference,) = torch.autograd.grad(reference.loss, hidden)
    (grad_chunked,) = torch.autograd.grad(chunked.loss, hidden)
    assert (grad_chunked - grad_reference).abs().max().item() < 1e-6
    assert grad_reference.abs().sum() > 0


def test_chunked_loss_scores_chunk_by_chunk_and_recomputes_in_backward():
    from draftsmith.train.loss import dflash_loss_from_hidden

    head, hidden, labels, label_mask, weights = _loss_inputs(3)
    kept = int(label_mask.sum())
    calls: list[int] = []

    def score(rows):
        calls.append(rows.shape[0])
        return head(rows)

    output = dflash_loss_from_hidden(hidden, score, labels, label_mask, weights, chunk_rows=16)
    forward_calls = list(calls)
    assert max(forward_calls) == 16 and sum(forward_calls) == kept and len(forward_calls) == -(-kept // 16)
    output.loss.backward()
    # Backward scored every chunk again (its logits were not kept), one chunk at a time.
    assert sorted(calls[len(forward_calls):]) == sorted(forward_calls)
    with pytest.raises(ValueError, match="chunk_rows"):
        dflash_loss_from_hidden(hidden, score, labels, label_mask, weights, chunk_rows=0)


def test_chunked_loss_under_bf16_autocast_matches_its_one_pass():
    from draftsmith.train.loss import dflash_loss_from_hidden

    torch.manual_seed(4)
    head = torch.nn.Linear(16, 50, bias=False).requires_grad_(False)
    hidden = torch.randn(2, 5, 7, 16, requires_grad=True)
    labels = torch.randint(0, 50, (2, 5, 7))
    label_mask = (torch.rand(2, 5, 7) > 0.2).float()
    results = []
    for chunk_rows in (None, 8):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = dflash_loss_from_hidden(hidden, head, labels, label_mask, position_weights(8), chunk_rows=chunk_rows)
        (grad,) = torch.autograd.grad(output.loss, hidden)
        results.append((output.loss.item(), grad))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-6, rtol=0)


def test_dpace_weights_by_hand():
    # One block, three predictions with confidences q = 0.8, 0.5, 0.2; alpha 0.5 smooths them to
    # q~ = 0.9, 0.75, 0.6; w_j = sum_{m >= j} prod_{i <= m} q~_i (arXiv 2605.18810, Eq. 7-8).
    from draftsmith.train.loss import dpace_position_weights

    q = torch.tensor([[0.8, 0.5, 0.2]])
    ce = -torch.log(q)
    mask = torch.ones(1, 3)
    reach = [0.9, 0.9 * 0.75, 0.9 * 0.75 * 0.6]
    expected = [sum(reach), reach[1] + reach[2], reach[2]]
    assert dpace_position_weights(ce, mask, 0.5)[0].tolist() == pytest.approx(expected, rel=1e-6)
    # A masked offset is a no-op in the products and adds nothing to the sums; it gets no weight.
    masked = dpace_position_weights(ce, torch.tensor([[1.0, 0.0, 1.0]]), 0.5)[0].tolist()
    assert masked == pytest.approx([0.9 + 0.9 * 0.6, 0.0, 0.9 * 0.6], rel=1e-6)
    # alpha 1 ignores confidence: each offset weighs the number of labelled offsets from it on.
    assert dpace_position_weights(ce, mask, 1.0)[0].tolist() == pytest.approx([3.0, 2.0, 1.0])
    for alpha in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            dpace_position_weights(ce, mask, alpha)


def test_dpace_loss_is_weighted_ce_over_blocks_with_detached_weights():
    from draftsmith.train.loss import dpace_position_weights, position_weighting

    torch.manual_seed(1)
    logits = torch.randn(2, 3, 4, 9, requires_grad=True)
    labels = torch.randint(0, 9, (2, 3, 4))
    label_mask = (torch.rand(2, 3, 4) > 0.2).float()
    label_mask[1, 2] = 0  # a padding block: no labels, not counted
    label_mask[..., 0] = torch.where(label_mask[..., 1:].sum(-1) > 0, 1.0, 0.0)
    ce = F.cross_entropy(logits.detach().reshape(-1, 9), labels.reshape(-1), reduction="none").view(2, 3, 4)
    weights = dpace_position_weights(ce, label_mask, 0.5)
    blocks = (label_mask[..., 0] > 0).sum()
    expected = (weights * ce).sum() / blocks
    output = dflash_loss(logits, labels, label_mask, position_weighting("dpace", 5, alpha=0.5))
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert output.blocks.item() == blocks.item()
    # A global denominator (the step's blocks on every rank) replaces the local count.
    scaled = dflash_loss(logits, labels, label_mask, position_weighting("dpace", 5), denominator=torch.tensor(4 * float(blocks)))
    assert scaled.loss.item() == pytest.approx(expected.item() / 4, rel=1e-6)
    # The weights carry no gradient: d loss / d logits is w * d CE / d logits.
    output.loss.backward()
    reference = logits.detach().clone().requires_grad_(True)
    ce_live = F.cross_entropy(reference.reshape(-1, 9), labels.reshape(-1), reduction="none").view(2, 3, 4)
    ((weights * ce_live).sum() / blocks).backward()
    torch.testing.assert_close(logits.grad, reference.grad)


def test_dpace_step_normalisation_does_not_depend_on_how_the_step_is_split():
    # Four blocks' worth of data split 1+3 or 2+2 over micro-batches: with the step's block count as
    # denominator the summed gradients are the same; a micro-batch-local count would differ.
    from draftsmith.train.loss import StepNormaliser, position_weighting, step_block_count

    torch.manual_seed(2)
    logits = torch.randn(4, 1, 5, 7)
    labels = torch.randint(0, 7, (4, 1, 5))
    label_mask = torch.ones(4, 1, 5)
    label_mask[0, 0, 3:] = 0
    weighting = position_weighting("dpace", 6)

    def step_gradient(splits):
        leaf = logits.clone().requires_grad_(True)
        masks = [label_mask[a:b] for a, b in splits]
        normaliser = StepNormaliser(weighting, len(splits), 1, step_block_count(masks))
        total = 0.0
        for a, b in splits:
            output = dflash_loss(leaf[a:b], labels[a:b], label_mask[a:b], weighting, normaliser.denominator)
            normaliser.backward_term(output.loss).backward()
            total += float(normaliser.share(output.loss))
        return leaf.grad, total

    one, loss_one = step_gradient([(0, 1), (1, 4)])
    two, loss_two = step_gradient([(0, 2), (2, 4)])
    whole, loss_whole = step_gradient([(0, 4)])
    torch.testing.assert_close(one, two)
    torch.testing.assert_close(one, whole)
    assert loss_one == pytest.approx(loss_whole) and loss_two == pytest.approx(loss_whole)
