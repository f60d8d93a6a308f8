"""`train --init-from-target`: draft layers start as copies of the target's last layers."""

from __future__ import annotations

import pytest
import torch

from draftsmith.model import DFlashDraftModel, build_drafter_config, decoder_layers, init_drafter_from_target
from draftsmith.train import TrainConfig, load_tokenized
from draftsmith.train.distributed import init_distributed
from draftsmith.train.trainer import DrafterTrainer


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()


def _same(a: torch.nn.Module, b: torch.nn.Module, name: str) -> bool:
    return torch.equal(a.get_parameter(name), b.get_parameter(name))


def test_draft_layers_copy_the_targets_last_layers(target):
    torch.manual_seed(0)
    drafter = DFlashDraftModel(build_drafter_config(target.config, num_draft_layers=2, mask_token_id=3))
    layers = decoder_layers(target)
    copied = init_drafter_from_target(drafter, target)
    last = len(layers) - 1
    for name in ("self_attn.q_proj.weight", "self_attn.k_norm.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
        assert _same(drafter.layers[0], layers[last - 1], name) and _same(drafter.layers[1], layers[last], name)
    assert torch.equal(drafter.norm.weight, target.model.norm.weight)
    assert len(copied) == 2 * 11 + 1  # 4 projections, q/k norms, 3 MLP, 2 layer norms per layer; the final norm
    assert not torch.equal(drafter.fc.weight, torch.zeros_like(drafter.fc.weight))  # fc keeps its random init


def test_shapes_that_differ_keep_their_random_init(target):
    torch.manual_seed(0)
    config = build_drafter_config(target.config, num_draft_layers=1, mask_token_id=3,
                                  intermediate_size=target.config.intermediate_size * 2)
    drafter = DFlashDraftModel(config)
    before = drafter.layers[0].mlp.up_proj.weight.clone()
    copied = init_drafter_from_target(drafter, target, source_layers=[0])
    assert torch.equal(drafter.layers[0].mlp.up_proj.weight, before)
    assert not any("mlp" in entry for entry in copied) and any("q_proj" in entry for entry in copied)
    with pytest.raises(ValueError, match="must name 1 of the target's"):
        init_drafter_from_target(drafter, target, source_layers=[99])


@pytest.mark.parametrize("offline", [False, True])
def test_the_trainer_starts_from_the_target_when_asked(regenerated, tiny_target_dir, tmp_path, target, offline):
    settings = dict(target=tiny_target_dir, data=regenerated, block_size=8, num_draft_layers=1, num_anchors=16,
                    dtype="fp32", device="cpu", data_workers=0)
    if offline:
        from draftsmith.train import extract_features

        extract_features(tiny_target_dir, regenerated, tmp_path / "features", dtype="float32", device="cpu",
                         progress=False, echo=lambda *args: None)
        settings.update(offline_features=tmp_path / "features")
    dataset = load_tokenized(regenerated)
    plain = DrafterTrainer(TrainConfig(out=tmp_path / "a", **settings), init_distributed("cpu"), dataset)
    seeded = DrafterTrainer(TrainConfig(out=tmp_path / "b", init_from_target=True, **settings), init_distributed("cpu"), dataset)
    last = decoder_layers(target)[-1]
    assert _same(seeded.drafter.layers[0], last, "self_attn.o_proj.weight")
    assert not _same(plain.drafter.layers[0], last, "self_attn.o_proj.weight")
    assert torch.equal(plain.drafter.fc.weight, seeded.drafter.fc.weight)  # the same seed for everything else
