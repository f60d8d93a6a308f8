"""`train --drafter dspark`: the DSpark loss, online = offline, exact resume, learning, bad flags."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from test_training import small_config

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.train import extract_features, load_tokenized, train_drafter
from draftsmith.train.blocks import build_block_batch
from draftsmith.train.distributed import init_distributed
from draftsmith.train.loss import dspark_loss_from_hidden
from draftsmith.train.trainer import DrafterTrainer


def test_dspark_labels_start_at_the_token_after_the_anchor():
    ids = torch.arange(10, 22)
    mask = torch.tensor([0, 0, 0] + [1] * 9)
    dflash = build_block_batch([(ids, mask, torch.tensor([4, 9]))], block_size=4, mask_token_id=99)
    dspark = build_block_batch([(ids, mask, torch.tensor([4, 9]))], block_size=4, mask_token_id=99, from_anchor=True)
    assert dflash.labels[0].tolist() == [[15, 16, 17], [20, 21, 0]]
    assert dspark.labels[0].tolist() == [[15, 16, 17, 18], [20, 21, 0, 0]]  # B predictions, the last past the end masked
    assert dspark.label_mask[0].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert dspark.block_size == dflash.block_size == 4
    assert torch.equal(dspark.noise_ids, dflash.noise_ids) and torch.equal(dspark.position_ids, dflash.position_ids)


def test_dspark_loss_is_ce_plus_l1_plus_confidence_chunked_or_not():
    torch.manual_seed(0)
    rows = torch.randn(2, 3, 4, 6, requires_grad=True)
    head = torch.randn(6, 11)
    labels = torch.randint(0, 11, (2, 3, 4))
    mask = (torch.rand(2, 3, 4) > 0.3).float()
    weights = torch.exp(-torch.arange(4.0) / 3)
    confidence = torch.randn(2, 3, 4, requires_grad=True)
    one_pass = dspark_loss_from_hidden(rows, lambda r: r @ head, labels, mask, weights, confidence, chunk_rows=None)
    chunked = dspark_loss_from_hidden(rows, lambda r: r @ head, labels, mask, weights, confidence, chunk_rows=5)
    torch.testing.assert_close(one_pass.loss, chunked.loss)

    # By hand: 0.1 CE + 0.9 |p - onehot|_1 + BCE(confidence, p(label)), each weighted and normalised alike.
    logits = rows @ head
    ce = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), reduction="none").view(labels.shape)
    p_label = torch.softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    l1 = (torch.softmax(logits, -1) - F.one_hot(labels, 11)).abs().sum(-1)
    bce = F.binary_cross_entropy_with_logits(confidence, p_label.detach(), reduction="none")
    w = mask * weights
    expected = ((0.1 * ce + 0.9 * l1 + bce) * w).sum() / w.sum()
    torch.testing.assert_close(one_pass.loss, expected)
    assert one_pass.correct.shape == (4,) and one_pass.counted.tolist() == mask.sum((0, 1)).tolist()
    without = dspark_loss_from_hidden(rows, lambda r: r @ head, labels, mask, weights, None, chunk_rows=None)
    torch.testing.assert_close(without.loss, ((0.1 * ce + 0.9 * l1) * w).sum() / w.sum())


@pytest.mark.parametrize("chunk_rows", [None, 3, 7])
def test_dspark_loss_grouped_by_previous_token_equals_the_packed_one(chunk_rows):
    """Scoring with `previous` (the Markov bias once per distinct previous token of a chunk, looked up
    per row) gives the loss and gradients of scoring every row's own packed Markov embedding."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 4, 6, dtype=torch.float64, requires_grad=True)
    head = torch.randn(6, 13, dtype=torch.float64)
    w1 = torch.randn(13, 3, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(3, 13, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 13, (2, 5, 4))
    previous = torch.randint(0, 4, (2, 5, 4))  # few distinct tokens: rows share them, as overlapping blocks do
    mask = (torch.rand(2, 5, 4) > 0.3).double()
    weights = torch.exp(-torch.arange(4.0) / 3).double()
    calls = []

    def grouped_score(rows, tokens, inverse):
        calls.append((rows.shape[0], tokens.shape[0]))
        return rows @ head + (w1[tokens] @ w2)[inverse]

    packed = dspark_loss_from_hidden(torch.cat([hidden, w1[previous]], -1), lambda rows: rows[:, :6] @ head + rows[:, 6:] @ w2,
                                     labels, mask, weights, chunk_rows=chunk_rows)  # fmt: skip
    grouped = dspark_loss_from_hidden(hidden, grouped_score, labels, mask, weights, chunk_rows=chunk_rows, previous=previous)
    torch.testing.assert_close(grouped.loss, packed.loss)
    for ours, theirs in zip(torch.autograd.grad(grouped.loss, (hidden, w1, w2)), torch.autograd.grad(packed.loss, (hidden, w1, w2))):
        torch.testing.assert_close(ours, theirs)
    assert sum(rows for rows, _ in calls) >= int(mask.sum()) and all(tokens <= min(rows, 4) for rows, tokens in calls)


def test_dspark_online_equals_offline_and_every_head_learns(regenerated, tiny_target_dir, tmp_path):
    features_dir = tmp_path / "features"
    extract_features(tiny_target_dir, regenerated, features_dir, dtype="float32", samples_per_shard=12, progress=False)
    online = small_config(tiny_target_dir, regenerated, tmp_path / "online", max_steps=3, drafter="dspark")  # default rank
    offline = online.model_copy(update={"out": tmp_path / "offline", "offline_features": features_dir})
    context = init_distributed("cpu")
    dataset = load_tokenized(regenerated)
    online_trainer = DrafterTrainer(online, context, dataset)
    offline_trainer = DrafterTrainer(offline, context, dataset)
    online_loss, _ = online_trainer.forward_loss(online_trainer.drafter, [0, 5, 17], 0)
    offline_loss, _ = offline_trainer.forward_loss(offline_trainer.drafter, [0, 5, 17], 0)
    assert online_loss.loss.item() == pytest.approx(offline_loss.loss.item(), rel=1e-5)
    assert online_loss.counted.numel() == 8  # block 8: eight predictions, from the anchor on
    online_loss.loss.backward()
    grads = {name: p.grad for name, p in online_trainer.drafter.named_parameters()}
    for name in ("markov_head.markov_w2.weight", "confidence_head.proj.weight", "confidence_head.proj.bias", "fc.weight"):
        assert grads[name] is not None and grads[name].abs().sum() > 0, name

    online_run = train_drafter(online)
    offline_run = train_drafter(offline)
    for (_, a), (_, b) in zip(online_run.losses, offline_run.losses, strict=True):
        assert a == pytest.approx(b, rel=1e-4)
    config = json.loads((tmp_path / "online" / "drafter" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["markov_rank"] == 256  # the default


def test_dspark_resume_is_exact_and_loss_drops(regenerated, tiny_target_dir, tmp_path):
    config = small_config(tiny_target_dir, regenerated, tmp_path / "full", epochs=2, save_every=4, keep_checkpoints=5,
                          drafter="dspark", markov_rank=24, lr=3e-3)  # not the default
    full = train_drafter(config)
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    for path in sorted((tmp_path / "cut" / "checkpoints").glob("step-*")):
        if int(path.name.split("-")[1]) > 4:
            shutil.rmtree(path)
    shutil.rmtree(tmp_path / "cut" / "drafter")
    resumed = train_drafter(config.model_copy(update={"out": tmp_path / "cut", "resume": True}))
    assert resumed.resumed_from_step == 4
    for (step, a), (_, b) in zip(full.losses[4:], resumed.losses[4:], strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7), step
    assert resumed.rank_checksums[0] == pytest.approx(full.rank_checksums[0], rel=1e-9)
    first, last = full.losses[0][1], sum(loss for _, loss in full.losses[-3:]) / 3
    assert last < first * 0.9, (first, last)
    assert len(full.accuracy_by_offset) == 8

    # Resumed without --markov-rank, the run goes on with its own rank, not the default.
    again = train_drafter(config.model_copy(update={"out": tmp_path / "cut", "resume": True, "markov_rank": None,
                                                    "epochs": 3, "max_steps": resumed.steps + 1}))
    assert again.resumed_from_step == resumed.steps and again.steps == resumed.steps + 1
    assert json.loads((tmp_path / "cut" / "drafter" / "config.json").read_text())["markov_rank"] == 24
    # Resuming the DSpark run with other DSpark settings, or as DFlash, is refused naming the flag.
    with pytest.raises(InputError, match="--markov-rank"):
        train_drafter(config.model_copy(update={"resume": True, "markov_rank": 8}))
    with pytest.raises(InputError, match="--drafter dflash: .* is a dspark run"):
        train_drafter(config.model_copy(update={"resume": True, "drafter": "dflash"}))


def test_bad_dspark_flags_exit_2_with_one_line_naming_the_flag(regenerated, tiny_target_dir, tmp_path, capsys):
    base = ["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--block-size", "4", "--draft-layers", "1",
            "--max-steps", "1", "--device", "cpu", "--no-progress", "--num-anchors", "4", "--threads", "1"]
    for rank in ("0", "-3", "100000000"):
        capsys.readouterr()
        assert main([*base, "--out", str(tmp_path / f"r{rank}"), "--drafter", "dspark", "--markov-rank", rank]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--markov-rank" in err[0] and "Traceback" not in err[0], err

    # A DFlash run resumed as DSpark.
    assert main([*base, "--out", str(tmp_path / "dflash"), "--save-every", "1", "--max-steps", "2"]) == 0
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "dflash"), "--max-steps", "3", "--resume", "--drafter", "dspark"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--drafter dspark" in err[0] and "dflash run" in err[0], err
