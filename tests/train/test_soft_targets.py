"""`--soft-targets`: the losses against the target's full next-token distribution, chunked, equal to a
plain full-vocabulary computation (values and gradients, float64); and online training with them."""

from __future__ import annotations

import pytest
import torch

from draftsmith.cli import main
from draftsmith.train.loss import TargetRows, dflash_loss_from_hidden, dspark_loss_from_hidden, position_weighting

VOCAB, HIDDEN = 41, 10


def _inputs(seed: int, predictions: int):
    torch.manual_seed(seed)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).double().requires_grad_(False)
    hidden = torch.randn(2, 5, predictions, HIDDEN, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, 5, predictions))
    label_mask = (torch.rand(2, 5, predictions) > 0.3).double()
    label_mask[1, 4] = 0  # a padding block
    # The target's states: 2 sequences x 9 positions; each prediction reads one of them.
    target_hidden = 3 * torch.randn(18, HIDDEN, dtype=torch.float64)
    index = torch.randint(0, 18, (2, 5, predictions))
    return head, hidden, labels, label_mask, TargetRows(target_hidden, index, head)


def _plain_terms(head, hidden, labels, target: TargetRows):
    """Full-vocabulary per-prediction (CE, KL(p || q), |p - q|_1), straight from the definitions."""
    q = torch.softmax(head(hidden), dim=-1)
    p = torch.softmax(head(target.hidden[target.index]), dim=-1)
    ce = -torch.log(q.gather(-1, labels[..., None]).squeeze(-1))
    kl = (p * (torch.log(p) - torch.log(q))).sum(-1)
    l1 = (p - q).abs().sum(-1)
    return ce, kl, l1


def _weighted(term, weights, label_mask):
    full = weights * label_mask
    return (term * full).sum() / full.sum()


@pytest.mark.parametrize("chunk_rows", [3, None])
@pytest.mark.parametrize("soft", ["kl", "tv"])
def test_dflash_soft_losses_equal_the_plain_full_vocabulary_ones(soft, chunk_rows):
    head, hidden, labels, label_mask, target = _inputs(0, predictions=6)
    weighting = position_weighting("decay", 7)
    output = dflash_loss_from_hidden(hidden, head, labels, label_mask, weighting, chunk_rows=chunk_rows, soft_targets=soft,
                                     target=target)  # fmt: skip
    weights = weighting.fixed.double()
    ce, kl, l1 = _plain_terms(head, hidden, labels, target)
    expected = _weighted(kl, weights, label_mask) if soft == "kl" else \
        0.1 * _weighted(kl, weights, label_mask) + 0.9 * _weighted(l1, weights, label_mask)  # fmt: skip
    torch.testing.assert_close(output.loss, expected, rtol=1e-12, atol=1e-12)
    # The logged CE is still the label's: comparable with a run without soft targets.
    torch.testing.assert_close(output.weighted_ce_sum, (ce * weights * label_mask).sum(), rtol=1e-12, atol=1e-12)
    (ours,) = torch.autograd.grad(output.loss, hidden)
    (plain,) = torch.autograd.grad(expected, hidden)
    torch.testing.assert_close(ours, plain, rtol=1e-10, atol=1e-12)
    assert ours[label_mask == 0].abs().sum() == 0


def test_kl_has_the_gradient_of_cross_entropy_against_the_target_distribution():
    head, hidden, labels, label_mask, target = _inputs(1, predictions=4)
    weighting = position_weighting("decay", 5)
    kl = dflash_loss_from_hidden(hidden, head, labels, label_mask, weighting, chunk_rows=2, soft_targets="kl", target=target)
    p = torch.softmax(head(target.hidden[target.index]), dim=-1)
    soft_ce = -(p * torch.log_softmax(head(hidden), dim=-1)).sum(-1)
    (ours,) = torch.autograd.grad(kl.loss, hidden)
    (theirs,) = torch.autograd.grad(_weighted(soft_ce, weighting.fixed.double(), label_mask), hidden)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk_rows", [4, None])
@pytest.mark.parametrize("soft", ["kl", "tv"])
def test_dspark_soft_losses_and_confidence_equal_the_plain_ones(soft, chunk_rows):
    head, hidden, labels, label_mask, target = _inputs(2, predictions=5)
    confidence = torch.randn(2, 5, 5, dtype=torch.float64, requires_grad=True)
    weighting = position_weighting("decay", 6)
    output = dspark_loss_from_hidden(hidden, head, labels, label_mask, weighting, confidence_logits=confidence,
                                     chunk_rows=chunk_rows, soft_targets=soft, target=target)  # fmt: skip
    weights = weighting.fixed.double()
    _, kl, l1 = _plain_terms(head, hidden, labels, target)
    accept = (torch.minimum(torch.softmax(head(hidden), -1), torch.softmax(head(target.hidden[target.index]), -1))).sum(-1)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(confidence, accept.detach(), reduction="none")
    divergence, distance = (1.0, 0.0) if soft == "kl" else (0.1, 0.9)
    expected = divergence * _weighted(kl, weights, label_mask) + distance * _weighted(l1, weights, label_mask) \
        + _weighted(bce, weights, label_mask)  # fmt: skip
    torch.testing.assert_close(output.loss, expected, rtol=1e-12, atol=1e-12)
    ours = torch.autograd.grad(output.loss, (hidden, confidence))
    plain = torch.autograd.grad(expected, (hidden, confidence))
    for a, b in zip(ours, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_target_that_rules_a_token_out_gives_finite_terms():
    head, hidden, labels, label_mask, target = _inputs(3, predictions=3)

    def masked_head(rows):
        logits = head(rows)
        logits[:, 0] = float("-inf")  # p = 0 for token 0: log p = -inf
        return logits

    target = TargetRows(target.hidden, target.index, masked_head)
    output = dflash_loss_from_hidden(hidden, head, labels, label_mask, position_weighting("decay", 4), chunk_rows=2,
                                     soft_targets="kl", target=target)  # fmt: skip
    (gradient,) = torch.autograd.grad(output.loss, hidden)
    assert torch.isfinite(output.loss) and torch.isfinite(gradient).all()


def _train(tiny_target_dir, regenerated, out, *flags) -> int:
    return main(["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(out), "--block-size", "8",
                 "--draft-layers", "1", "--num-anchors", "8", "--batch-size", "4", "--dtype", "fp32", "--device", "cpu",
                 "--threads", "1", "--no-progress", "--data-workers", "0", "--lr", "5e-3", "--warmup-ratio", "0", *flags])  # fmt: skip


@pytest.mark.parametrize("drafter", ["dflash", "dspark"])
def test_online_soft_targets_train_and_the_target_rows_are_its_next_token_distribution(drafter, regenerated, tiny_target_dir,
                                                                                      tmp_path):  # fmt: skip
    import json

    from draftsmith.train import TrainConfig, load_tokenized
    from draftsmith.train.distributed import init_distributed
    from draftsmith.train.trainer import DrafterTrainer

    extra = ["--drafter", drafter, "--markov-rank", "8"] if drafter == "dspark" else []
    assert _train(tiny_target_dir, regenerated, tmp_path / "run", "--soft-targets", "tv", "--max-steps", "12", "--log-every", "4",
                  *extra) == 0  # fmt: skip
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0], losses
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["settings"]["soft_targets"] == "tv"

    # Each prediction's target row is the target's own logits for the token its label is.
    config = TrainConfig(target=tiny_target_dir, data=regenerated, out=tmp_path / "x", block_size=8, num_draft_layers=1,
                         dtype="fp32", device="cpu", soft_targets="kl", drafter=drafter, markov_rank=8 if extra else None)  # fmt: skip
    trainer = DrafterTrainer(config, init_distributed("cpu"), load_tokenized(regenerated))
    batch = trainer.make_batch([0, 1], epoch=0)
    _, final = trainer.context_inputs(batch, [0, 1])
    rows = trainer._target_rows(final, batch)
    with torch.no_grad():
        logits = trainer.target(input_ids=batch.context_ids, attention_mask=batch.context_mask).logits
    kept = batch.label_mask > 0
    ours = rows.score(rows.hidden[rows.index[kept]])
    sequence = torch.arange(2)[:, None, None].expand_as(batch.labels)[kept]
    position = (batch.anchors[..., None] + torch.arange(batch.labels.shape[-1]))[kept]
    torch.testing.assert_close(ours, logits[sequence, position], rtol=1e-4, atol=1e-4)


def test_offline_soft_targets_from_the_stored_last_layer_equal_online_and_without_it_exit_2(regenerated, tiny_target_dir,
                                                                                            tmp_path, capsys):  # fmt: skip
    from draftsmith.train import TrainConfig, extract_features, load_tokenized
    from draftsmith.train.distributed import init_distributed
    from draftsmith.train.trainer import DrafterTrainer

    # The tiny target has 4 layers: its last (3) stored, its output through the final norm and head is the target's distribution.
    with_last, without = tmp_path / "with-last", tmp_path / "without"
    extract_features(tiny_target_dir, regenerated, with_last, target_layer_ids=[1, 3], dtype="float32", progress=False)
    extract_features(tiny_target_dir, regenerated, without, target_layer_ids=[1, 2], dtype="float32", progress=False)
    online = TrainConfig(target=tiny_target_dir, data=regenerated, out=tmp_path / "on", block_size=8, num_draft_layers=1,
                         dtype="fp32", device="cpu", soft_targets="tv", target_layer_ids=[1, 3], num_anchors=8)  # fmt: skip
    dataset = load_tokenized(regenerated)
    online_trainer = DrafterTrainer(online, init_distributed("cpu"), dataset)
    offline_trainer = DrafterTrainer(online.model_copy(update={"offline_features": with_last}), init_distributed("cpu"), dataset)
    assert offline_trainer.target is None
    batch = online_trainer.make_batch([0, 5, 17], epoch=0)
    _, online_final = online_trainer.context_inputs(batch, [0, 5, 17])
    _, offline_final = offline_trainer.context_inputs(batch, [0, 5, 17])
    real = batch.context_mask.bool()
    torch.testing.assert_close(offline_final[real], online_final[real], rtol=1e-5, atol=1e-5)
    on, _ = online_trainer.forward_loss(online_trainer.drafter, [0, 5, 17], 0)
    off, _ = offline_trainer.forward_loss(offline_trainer.drafter, [0, 5, 17], 0)
    assert off.loss.item() == pytest.approx(on.loss.item(), rel=1e-5)

    capsys.readouterr()
    code = _train(tiny_target_dir, regenerated, tmp_path / "o", "--soft-targets", "kl", "--offline", str(without))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--soft-targets kl" in err[0] and "including 3" in err[0], err
