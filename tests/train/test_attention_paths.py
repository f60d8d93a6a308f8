"""A training step on the tiny target gives the same loss and gradients with every attention path."""

from __future__ import annotations

import pytest
import torch

from draftsmith.model.block_attention import DEFAULT_TILE_QUERIES
from draftsmith.train import TrainConfig, load_tokenized
from draftsmith.data.tokenized import write_tokenized
from draftsmith.train.distributed import init_distributed
from draftsmith.train.trainer import DrafterTrainer


@pytest.fixture(scope="module")
def mixed_lengths(tmp_path_factory) -> tuple:
    # Different lengths in one micro-batch, one sequence shorter than the block, prompts of different
    # lengths: padding context, padding blocks and blocks running past the end all occur.
    generator = torch.Generator().manual_seed(3)
    rows = []
    for index, (prompt, response) in enumerate(((20, 70), (3, 2), (9, 30), (40, 6))):
        ids = torch.randint(10, 1000, (prompt + response,), generator=generator).tolist()
        rows.append({"id": f"s{index}", "input_ids": ids, "loss_mask": [0] * prompt + [1] * response})
    out = tmp_path_factory.mktemp("mixed") / "tokenized"
    write_tokenized(rows, out)
    return out, load_tokenized(out)


def test_dense_and_sparse_training_steps_match(mixed_lengths, tiny_target_dir, tmp_path):
    torch.set_num_threads(1)
    data, dataset = mixed_lengths
    context = init_distributed("cpu")
    results = {}
    for attention in ("dense", "sparse", "auto"):
        config = TrainConfig(
            target=tiny_target_dir, data=data, out=tmp_path / attention, block_size=8, num_draft_layers=2,
            num_anchors=48, dtype="fp32", device="cpu", progress=False, attention=attention,
        )
        trainer = DrafterTrainer(config, context, dataset)
        output, batch = trainer.forward_loss(trainer.drafter, [0, 1, 2, 3], epoch=0)
        output.loss.backward()
        grads = {name: parameter.grad.clone() for name, parameter in trainer.drafter.named_parameters()}
        results[attention] = (trainer.attention, output.loss.item(), grads, batch)
    assert results["auto"][0] == "sparse"
    batch = results["dense"][3]
    assert not batch.anchor_valid.all()  # padding blocks are part of the check
    assert batch.anchors.shape[1] * config.block_size > DEFAULT_TILE_QUERIES  # several tiles of the sparse path
    assert int(batch.context_mask.sum(1).min()) < config.block_size
    _, dense_loss, dense_grads, _ = results["dense"]
    _, sparse_loss, sparse_grads, _ = results["sparse"]
    assert sparse_loss == pytest.approx(dense_loss, rel=1e-6)
    for name, grad in dense_grads.items():
        torch.testing.assert_close(sparse_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
