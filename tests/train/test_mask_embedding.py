"""A target with no spare id: the drafter trains its own mask embedding, and eval, export and check follow it."""

from __future__ import annotations

import pytest
import torch

from draftsmith.tiny.families import build_family_target


@pytest.fixture(scope="module")
def nopad_run(tmp_path_factory):
    """A Mistral-v0.1-like target (no pad, no reserved id, no padding row) trained 3 steps, exported,
    evaluated strictly (a speculative output that differs from plain greedy raises)."""
    from draftsmith.gates.overfit import prepare_overfit

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("nopad")
    target = build_family_target("mistral-nopad", root / "target")
    return target, prepare_overfit(target, root / "run", samples=1, steps=3, max_new_tokens=12)


def test_the_mask_embedding_gets_gradient_and_training_changes_it(nopad_run, tmp_path):
    from draftsmith.model.io import read_mask_embedding_file
    from draftsmith.train import TrainConfig, load_tokenized, train_drafter
    from draftsmith.train.distributed import init_distributed
    from draftsmith.train.trainer import DrafterTrainer

    target, prepared = nopad_run
    data = f"{prepared.work}/tokenized"
    config = TrainConfig(target=target, data=data, out=tmp_path / "train", block_size=8, num_draft_layers=1,
                         max_steps=3, epochs=3, batch_size=1, lr=5e-3, warmup_ratio=0.0, progress=False, seed=0)
    trainer = DrafterTrainer(config, init_distributed("cpu"), load_tokenized(data))
    assert trainer.drafter_config.dflash_config["mask_token_source"] == "drafter_embedding"
    initial = trainer.drafter.mask_embedding.detach().clone()
    output, _ = trainer.forward_loss(trainer.drafter, [0], epoch=0)
    output.loss.backward()
    assert float(trainer.drafter.mask_embedding.grad.abs().sum()) > 0

    result = train_drafter(config)  # same config and seed: the same initial vector
    token_id, trained = read_mask_embedding_file(result.drafter_dir / "mask_embedding.pt")
    assert token_id == trainer.mask_token_id
    assert float((trained - initial).abs().max()) > 1e-4


def test_the_export_ships_mask_embedding_pt_evaluates_losslessly_and_checks_clean(nopad_run):
    from draftsmith.check.config import CheckConfig
    from draftsmith.check.runner import check_export
    from draftsmith.model import load_drafter_config

    target, prepared = nopad_run
    assert prepared.new_tokens > 0  # eval ran strict inside prepare_overfit
    config = load_drafter_config(prepared.export_dir)
    assert config.dflash_config["mask_token_source"] == "drafter_embedding"
    saved = torch.load(f"{prepared.export_dir}/mask_embedding.pt", weights_only=True)
    assert saved["mask_token_id"] == config.mask_token_id and saved["embedding"].shape == (config.hidden_size,)
    summary = check_export(CheckConfig(export=prepared.export_dir, target=target, parity=True))
    assert [f.line() for f in summary.findings if f.severity in ("error", "warning")] == []
    assert summary.parity.status in ("passed", "skipped"), summary.parity.detail
