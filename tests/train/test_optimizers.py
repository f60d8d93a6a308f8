"""`--optimizer muon`: which parameters Muon takes, the composite equal to torch's two optimizers run
side by side (through a state_dict round trip), and a resume across optimizers refused in one line."""

from __future__ import annotations

import copy

import pytest
import torch

from draftsmith.cli import main
from draftsmith.train import TrainConfig, load_tokenized
from draftsmith.train.distributed import init_distributed
from draftsmith.train.optimizers import MuonWithAdamW, make_optimizer
from draftsmith.train.trainer import DrafterTrainer, build_optimizer


def _config(target, data, out, **overrides) -> TrainConfig:
    settings = dict(target=target, data=data, out=out, block_size=8, num_draft_layers=1, dtype="fp32", device="cpu",
                    num_threads=1, progress=False, data_workers=0, num_anchors=8, lr=2e-3, warmup_ratio=0.0, batch_size=2)
    return TrainConfig(**{**settings, **overrides})


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(regenerated, tiny_target_dir, tmp_path):
    config = _config(tiny_target_dir, regenerated, tmp_path / "o", drafter="dspark", optimizer="muon", markov_rank=8,
                     weight_decay=0.01)  # fmt: skip
    trainer = DrafterTrainer(config, init_distributed("cpu"), load_tokenized(regenerated))
    optimizer, _ = build_optimizer(trainer.drafter, config, total_steps=4)
    assert isinstance(optimizer, MuonWithAdamW)
    names = {id(parameter): name for name, parameter in trainer.drafter.named_parameters()}
    muon = {names[id(p)] for group in optimizer.muon.param_groups for p in group["params"]}
    adamw = {names[id(p)]: group["weight_decay"] for group in optimizer.adamw.param_groups for p in group["params"]}
    assert muon | set(adamw) == set(names.values()) and not muon & set(adamw)
    assert "fc.weight" in muon and "layers.0.self_attn.q_proj.weight" in muon and "layers.0.mlp.down_proj.weight" in muon
    assert all(name.endswith("weight") and trainer.drafter.get_parameter(name).ndim == 2 for name in muon)
    # Token-indexed table, vocabulary head, a [1, D] row, norms: AdamW; only matrices decay.
    assert adamw["markov_head.markov_w1.weight"] == adamw["markov_head.markov_w2.weight"] == 0.01
    assert adamw["confidence_head.proj.weight"] == 0.01 and adamw["confidence_head.proj.bias"] == 0.0
    assert adamw["norm.weight"] == adamw["layers.0.input_layernorm.weight"] == 0.0
    assert optimizer.muon.param_groups[0]["lr"] == pytest.approx(2e-3)  # --muon-lr unset: --lr, on the same schedule
    assert optimizer.muon.param_groups[0]["weight_decay"] == 0.1
    assert optimizer.muon.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def _step(model, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(7, 6, generator=generator)
    optimizer.zero_grad()
    model(inputs).square().mean().backward()
    optimizer.step()


def test_the_composite_steps_as_torchs_muon_and_adamw_side_by_side_and_resumes_exactly(tmp_path):
    config = TrainConfig(target=tmp_path, data=tmp_path, out=tmp_path, optimizer="muon", lr=1e-2, weight_decay=0.05,
                         muon_weight_decay=0.2, muon_momentum=0.9)  # fmt: skip
    ours = _model(0)
    composite = make_optimizer(ours, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(composite, lambda step: 1.0 / (step + 1))
    theirs = _model(0)
    muon_params = [theirs[0].weight, theirs[2].weight]
    reference_muon = torch.optim.Muon(muon_params, lr=1e-2, momentum=0.9, weight_decay=0.2, adjust_lr_fn="match_rms_adamw")
    reference_adamw = torch.optim.AdamW([{"params": [theirs[0].bias, theirs[1].weight, theirs[1].bias, theirs[2].bias],
                                          "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.95))  # fmt: skip
    for step in range(3):
        _step(ours, composite, step)
        scheduler.step()
        generator = torch.Generator().manual_seed(step)
        inputs = torch.randn(7, 6, generator=generator)
        for optimizer in (reference_muon, reference_adamw):
            optimizer.zero_grad()
        theirs(inputs).square().mean().backward()
        reference_muon.step()
        reference_adamw.step()
        for optimizer in (reference_muon, reference_adamw):
            for group in optimizer.param_groups:
                group["lr"] = 1e-2 / (step + 2)
        for mine, reference in zip(ours.parameters(), theirs.parameters(), strict=True):
            torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(a, b) for a, b in zip(ours.parameters(), _model(0).parameters(), strict=True))

    # A saved state restored into a fresh composite continues exactly as the original does.
    saved_optimizer, saved_scheduler = copy.deepcopy(composite.state_dict()), copy.deepcopy(scheduler.state_dict())
    resumed = copy.deepcopy(ours)
    fresh = make_optimizer(resumed, config)
    fresh_scheduler = torch.optim.lr_scheduler.LambdaLR(fresh, lambda step: 1.0 / (step + 1))
    fresh.load_state_dict(saved_optimizer)
    fresh_scheduler.load_state_dict(saved_scheduler)
    assert fresh.muon.state is fresh.state and fresh.muon.param_groups[0] is fresh.param_groups[0]
    for step in range(3, 5):
        _step(ours, composite, step)
        _step(resumed, fresh, step)
    for a, b in zip(ours.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("first, then", [("adamw", "muon"), ("muon", "adamw")])
def test_resuming_with_another_optimizer_is_one_line_and_exit_2(first, then, regenerated, tiny_target_dir, tmp_path, capsys):
    common = ["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(tmp_path / "o"), "--block-size",
              "8", "--draft-layers", "1", "--num-anchors", "4", "--batch-size", "4", "--max-steps", "1", "--dtype", "fp32",
              "--device", "cpu", "--threads", "1", "--no-progress", "--data-workers", "0"]  # fmt: skip
    assert main([*common, "--optimizer", first]) == 0
    capsys.readouterr()
    code = main([*common, "--optimizer", then, "--resume", "--max-steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"--optimizer {then}" in err[0] and f"holds {first}'s optimizer state" in err[0], err
