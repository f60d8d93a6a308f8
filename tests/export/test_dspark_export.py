"""`export` of a DSpark drafter: exactly the config keys and weight names vLLM's qwen3_dspark.py loads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from draftsmith.core.errors import InputError
from draftsmith.export import export_drafter
from draftsmith.model import build_drafter_config, expected_weight_names, load_drafter
from draftsmith.model.dspark import DSparkDraftModel, build_dspark_config

# The names Qwen3DSparkForCausalLM.load_weights maps under `model.` (besides the DFlash backbone's).
VLLM_DSPARK_HEADS = {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                     "confidence_head.proj.weight", "confidence_head.proj.bias"}


@pytest.fixture(scope="module")
def dspark(tiny_target_dir):
    from transformers import AutoConfig

    base = build_drafter_config(AutoConfig.from_pretrained(tiny_target_dir), num_draft_layers=2, block_size=6, mask_token_id=3)
    torch.manual_seed(1)
    model = DSparkDraftModel(build_dspark_config(base, markov_rank=12))
    with torch.no_grad():  # perturb every parameter so a swapped or dropped tensor shows up
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


def test_dspark_export_holds_vllms_keys_and_names(dspark, tmp_path):
    result = export_drafter(dspark, tmp_path / "export")
    assert result.num_speculative_tokens == 6  # block_size: DSpark drafts from the anchor
    assert sorted(result.files) == ["README.md", "config.json", "model.safetensors"]  # no mask_embedding.pt
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["model_type"] == "qwen3"
    for key, value in {"markov_rank": 12, "draft_vocab_size": config["vocab_size"], "enable_confidence_head": True,
                       "confidence_head_with_markov": True, "block_size": 6, "sample_from_anchor": True}.items():
        assert config[key] == value, key
    assert set(config["dflash_config"]) >= {"mask_token_id", "target_layer_ids"}
    with safe_open(str(tmp_path / "export" / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
        shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in VLLM_DSPARK_HEADS}
    assert VLLM_DSPARK_HEADS <= names and names == expected_weight_names(dspark.config)
    assert not any(name.startswith(("embed_tokens", "lm_head", "model.")) for name in names)
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    assert shapes == {"markov_head.markov_w1.weight": (vocab, 12), "markov_head.markov_w2.weight": (vocab, 12),
                      "confidence_head.proj.weight": (1, hidden + 12), "confidence_head.proj.bias": (1,)}
    reloaded = load_drafter(tmp_path / "export")
    for name, tensor in dspark.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor, rtol=0, atol=0)
    readme = (tmp_path / "export" / "README.md").read_text()
    assert '"method": "dspark"' in readme and '"num_speculative_tokens": 6' in readme


def test_a_dspark_head_that_does_not_survive_the_round_trip_is_refused(dspark, tmp_path, monkeypatch):
    import draftsmith.export.exporter as exporter

    real = exporter.load_drafter

    def flipping_loader(path, *args, **kwargs):
        model = real(path, *args, **kwargs)
        with torch.no_grad():
            model.markov_head.markov_w1.weight.mul_(-1)
        return model

    monkeypatch.setattr(exporter, "load_drafter", flipping_loader)
    with pytest.raises(InputError, match="does not reproduce the source"):
        export_drafter(dspark, tmp_path / "bad")
