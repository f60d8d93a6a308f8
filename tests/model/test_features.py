"""Target layer i's feature is decoder layer i's output before the final norm, for every layer."""

from __future__ import annotations

import pytest
import torch

from draftsmith.model import (
    FEATURE_DEFINITION,
    LayerFeatureTap,
    build_drafter_config,
    decoder_layers,
    extract_target_features,
    feature_definition_warning,
    uses_old_last_layer_feature,
)


def _layer_outputs_by_hooks(target, ids, attention_mask):
    """Every decoder layer's output, captured independently of draftsmith's tap."""
    outputs: dict[int, torch.Tensor] = {}
    handles = []
    for index, layer in enumerate(target.model.layers):
        def keep(module, inputs, output, index=index):
            outputs[index] = (output[0] if isinstance(output, tuple) else output).detach().clone()

        handles.append(layer.register_forward_hook(keep))
    try:
        with torch.no_grad():
            hf = target(ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return outputs, hf.hidden_states


def test_every_layer_feature_is_its_pre_norm_output(tiny_target):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 1000, (2, 11), generator=generator)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 8:] = 0  # a padded row, as in training batches
    num_layers = len(decoder_layers(tiny_target))
    outputs, hidden_states = _layer_outputs_by_hooks(tiny_target, ids, attention_mask)
    assert sorted(outputs) == list(range(num_layers))
    for layer_id in range(num_layers):
        ours = extract_target_features(tiny_target, ids, attention_mask, [layer_id])
        torch.testing.assert_close(ours, outputs[layer_id], rtol=0, atol=1e-6)
        if layer_id < num_layers - 1:
            torch.testing.assert_close(ours, hidden_states[layer_id + 1], rtol=0, atol=1e-6)
    last = extract_target_features(tiny_target, ids, attention_mask, [num_layers - 1])
    # transformers' last hidden state is the same tensor after the final norm; ours is before it.
    assert (last - hidden_states[num_layers]).abs().max() > 1e-2
    torch.testing.assert_close(tiny_target.model.norm(last), hidden_states[num_layers], rtol=1e-5, atol=1e-5)
    every = extract_target_features(tiny_target, ids, attention_mask, list(range(num_layers)))
    torch.testing.assert_close(every, torch.cat([outputs[i] for i in range(num_layers)], -1), rtol=0, atol=1e-6)


def test_the_tap_follows_each_forward_and_rejects_bad_ids(tiny_target):
    ids = torch.randint(10, 1000, (1, 7), generator=torch.Generator().manual_seed(1))
    # transformers keeps hooks of its own on the layers; the tap must leave exactly those behind.
    hooks_before = [len(layer._forward_hooks) for layer in decoder_layers(tiny_target)]
    with LayerFeatureTap(tiny_target, [3, 1]) as tap:
        with torch.no_grad():
            tiny_target(ids, use_cache=False)
            first = tap.take()
            tiny_target(ids[:, :4], use_cache=False)
            second = tap.take()
        with pytest.raises(RuntimeError, match="no output captured"):
            tap.take()
    assert first.shape == (1, 7, 2 * 128) and second.shape == (1, 4, 2 * 128)
    outputs, _ = _layer_outputs_by_hooks(tiny_target, ids, None)
    torch.testing.assert_close(first, torch.cat([outputs[3], outputs[1]], -1), rtol=0, atol=1e-6)
    assert [len(layer._forward_hooks) for layer in decoder_layers(tiny_target)] == hooks_before
    with pytest.raises(ValueError, match="out of range"):
        LayerFeatureTap(tiny_target, [4])


def test_old_last_layer_drafters_are_flagged(tiny_target):
    config = build_drafter_config(tiny_target.config, num_draft_layers=1, mask_token_id=3, target_layer_ids=[0, 1, 2, 3])
    assert config.dflash_config["feature_definition"] == FEATURE_DEFINITION
    assert not uses_old_last_layer_feature(config) and feature_definition_warning(config) is None
    del config.dflash_config["feature_definition"]
    assert uses_old_last_layer_feature(config)
    assert "last layer (3)" in feature_definition_warning(config)
    config.dflash_config["target_layer_ids"] = [0, 1, 2]
    assert not uses_old_last_layer_feature(config)  # layers below the last were always pre-norm
