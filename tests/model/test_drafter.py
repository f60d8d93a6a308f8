from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from draftsmith.core.errors import InputError
from draftsmith.model import (
    FEATURE_DEFINITION,
    DFlashConfig,
    DFlashDraftModel,
    build_drafter_config,
    default_target_layer_ids,
    ensure_mask_token,
    expected_weight_names,
    extract_target_features,
    load_drafter,
    save_drafter,
    target_embed_tokens,
    target_lm_head,
)


def test_default_target_layer_ids_follow_the_paper_rule():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(28, 5) == [1, 7, 13, 19, 25]
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(36, 3) == [1, 17, 33]


def test_default_target_layer_ids_stay_distinct_for_shallow_targets():
    assert default_target_layer_ids(4, 5) == [0, 1, 2]
    assert default_target_layer_ids(4, 2) == [0, 2]
    ids = default_target_layer_ids(6, 5)
    assert len(set(ids)) == len(ids) == 5 and max(ids) < 5


def test_default_target_layer_ids_never_take_the_last_layer():
    # SGLang crashes on it and the reference reads it after the final norm (vLLM before).
    for layers in range(2, 40):
        for features in range(1, 7):
            assert max(default_target_layer_ids(layers, features)) < layers - 1, (layers, features)


def test_build_config_matches_the_checkpoint_format(tiny_target, tiny_drafter_config):
    config = tiny_drafter_config
    assert isinstance(config, DFlashConfig)
    assert config.architectures == ["DFlashDraftModel"] and config.model_type == "qwen3"
    assert config.num_hidden_layers == 2 and config.layer_types == ["full_attention"] * 2
    assert config.block_size == 8 and config.num_target_layers == 4
    assert config.dflash_config == {
        "mask_token_id": 3, "target_layer_ids": [0, 1, 2], "feature_definition": FEATURE_DEFINITION,
        "trained_windows": [None, None],  # full attention, recorded for `check`
        "target_architectures": ["Qwen3ForCausalLM"],  # which engines can serve it, for `check` and `export`
    }
    for field in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"):
        assert getattr(config, field) == getattr(tiny_target.config, field)
    assert config.rope_parameters["rope_theta"] == tiny_target.config.rope_parameters["rope_theta"]


def test_build_config_rejects_bad_inputs(tiny_target):
    with pytest.raises(ValueError, match="mask_token_id"):
        build_drafter_config(tiny_target.config)
    with pytest.raises(ValueError, match="target_layer_ids"):
        build_drafter_config(tiny_target.config, mask_token_id=3, target_layer_ids=[0, 4])
    with pytest.raises(ValueError, match="outside the target's embedding"):
        build_drafter_config(tiny_target.config, mask_token_id=5000)


def test_tiny_tokenizer_mask_token_is_found_not_added(tiny_tokenizer):
    before = len(tiny_tokenizer)
    assert ensure_mask_token(tiny_tokenizer) == tiny_tokenizer.convert_tokens_to_ids("<|MASK|>")
    assert len(tiny_tokenizer) == before


def test_ensure_mask_token_adds_and_resizes(tiny_target_dir):
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    raw = Tokenizer.from_file(str(tiny_target_dir / "tokenizer.json"))
    vocab = {t: i for t, i in raw.get_vocab().items() if t != "<|MASK|>"}
    assert len(vocab) == len(raw.get_vocab()) - 1
    from tokenizers.models import WordLevel

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<|endoftext|>")))
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    rows = model.get_input_embeddings().num_embeddings
    new_id = ensure_mask_token(tokenizer, model)
    assert tokenizer.convert_tokens_to_ids("<|MASK|>") == new_id
    assert model.get_input_embeddings().num_embeddings >= max(rows, new_id + 1)
    assert ensure_mask_token(tokenizer, model) == new_id


def test_weight_names_and_no_embeddings(tiny_drafter_config):
    model = DFlashDraftModel(tiny_drafter_config)
    names = set(model.state_dict())
    assert names == expected_weight_names(tiny_drafter_config)
    assert not any("embed" in n or "lm_head" in n for n in names)
    hidden = tiny_drafter_config.hidden_size
    assert model.fc.weight.shape == (hidden, len(tiny_drafter_config.target_layer_ids) * hidden)


def _inputs(target, tokenizer, config, context_len=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 1000, (2, context_len + 1), generator=generator)
    features = extract_target_features(target, ids[:, :context_len], None, config.target_layer_ids)
    block = torch.full((2, config.block_size), config.mask_token_id)
    block[:, 0] = ids[:, context_len]
    noise = target_embed_tokens(target)(block).detach()
    positions = torch.arange(context_len + config.block_size).expand(2, -1)
    return features, noise, positions


def test_forward_shapes_and_logits(tiny_target, tiny_tokenizer, tiny_drafter_config):
    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_drafter_config).eval()
    features, noise, positions = _inputs(tiny_target, tiny_tokenizer, tiny_drafter_config)
    assert features.shape == (2, 12, len(tiny_drafter_config.target_layer_ids) * 128)
    hidden = model(position_ids=positions, noise_embedding=noise, target_hidden=features)
    assert hidden.shape == (2, 8, 128)
    logits = model.compute_logits(hidden, target_lm_head(tiny_target))
    assert logits.shape == (2, 8, tiny_target.config.vocab_size)
    with pytest.raises(ValueError, match="position_ids"):
        model(position_ids=positions[:, :-1], noise_embedding=noise, target_hidden=features)


def test_masked_context_is_invisible_and_visible_context_matters(tiny_target, tiny_tokenizer, tiny_drafter_config):
    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_drafter_config).eval()
    features, noise, positions = _inputs(tiny_target, tiny_tokenizer, tiny_drafter_config)
    context_len, block = features.shape[1], noise.shape[1]
    visible = torch.ones(2, 1, block, context_len + block, dtype=torch.bool)
    visible[..., 6:context_len] = False  # context keys 6.. are hidden from every query

    perturbed = features.clone()
    perturbed[:, 6:] += 5 * torch.randn_like(perturbed[:, 6:])
    with torch.no_grad():
        base = model(position_ids=positions, attention_mask=visible, noise_embedding=noise, target_hidden=features)
        same = model(position_ids=positions, attention_mask=visible, noise_embedding=noise, target_hidden=perturbed)
        additive = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
        same_float = model(
            position_ids=positions, attention_mask=additive, noise_embedding=noise, target_hidden=perturbed
        )
        unmasked = model(position_ids=positions, noise_embedding=noise, target_hidden=features)
        unmasked_perturbed = model(position_ids=positions, noise_embedding=noise, target_hidden=perturbed)
    torch.testing.assert_close(base, same)
    torch.testing.assert_close(base, same_float)
    assert (unmasked - unmasked_perturbed).abs().max() > 1e-3
    assert (base - unmasked).abs().max() > 1e-3


def test_block_is_bidirectional(tiny_target, tiny_tokenizer, tiny_drafter_config):
    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_drafter_config).eval()
    features, noise, positions = _inputs(tiny_target, tiny_tokenizer, tiny_drafter_config)
    changed = noise.clone()
    changed[:, -1] += 1.0  # the LAST block token changes; the FIRST query must notice (non-causal)
    with torch.no_grad():
        a = model(position_ids=positions, noise_embedding=noise, target_hidden=features)
        b = model(position_ids=positions, noise_embedding=changed, target_hidden=features)
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-4


def test_cached_context_equals_full_context(tiny_target, tiny_tokenizer, tiny_drafter_config):
    from transformers import DynamicCache

    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_drafter_config).eval()
    features, noise, positions = _inputs(tiny_target, tiny_tokenizer, tiny_drafter_config)
    with torch.no_grad():
        full = model(position_ids=positions, noise_embedding=noise, target_hidden=features)
        cache = DynamicCache(config=tiny_drafter_config)
        split = 7
        # First call: context[:split] plus a throw-away block, then crop the block off the cache.
        model(
            position_ids=torch.arange(split + noise.shape[1]).expand(2, -1),
            noise_embedding=noise,
            target_hidden=features[:, :split],
            past_key_values=cache,
            use_cache=True,
        )
        cache.crop(-noise.shape[1])
        assert cache.get_seq_length() == split
        cached = model(
            position_ids=positions[:, split:],
            noise_embedding=noise,
            target_hidden=features[:, split:],
            past_key_values=cache,
            use_cache=True,
        )
    torch.testing.assert_close(full, cached, atol=1e-5, rtol=1e-4)


def test_save_and_load_round_trip(tmp_path, tiny_target, tiny_tokenizer, tiny_drafter_config):
    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_drafter_config).eval()
    out = save_drafter(model, tmp_path / "drafter")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    for key in ("block_size", "num_target_layers", "num_hidden_layers", "layer_types", "dflash_config"):
        assert key in config
    assert config["dflash_config"] == {
        "mask_token_id": 3, "target_layer_ids": [0, 1, 2], "feature_definition": FEATURE_DEFINITION,
        "trained_windows": [None, None],  # full attention, recorded for `check`
        "target_architectures": ["Qwen3ForCausalLM"],  # which engines can serve it, for `check` and `export`
    }
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] and config["rope_scaling"] is None
    assert not {"id2label", "label2id", "problem_type", "return_dict"} & set(config)
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert set(handle.keys()) == expected_weight_names(tiny_drafter_config)

    loaded = load_drafter(out)
    features, noise, positions = _inputs(tiny_target, tiny_tokenizer, tiny_drafter_config)
    with torch.no_grad():
        torch.testing.assert_close(
            model(position_ids=positions, noise_embedding=noise, target_hidden=features),
            loaded(position_ids=positions, noise_embedding=noise, target_hidden=features),
        )
    half = load_drafter(save_drafter(model, tmp_path / "bf16", dtype=torch.bfloat16))
    assert half.fc.weight.dtype == torch.bfloat16
    assert half.rotary_emb.inv_freq.dtype == torch.float32  # RoPE frequencies are never rounded
    torch.testing.assert_close(half.rotary_emb.inv_freq, model.rotary_emb.inv_freq)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_load_errors_name_the_file(tmp_path, tiny_drafter_config):
    with pytest.raises(InputError, match="config.json: not found"):
        load_drafter(tmp_path)
    model = DFlashDraftModel(tiny_drafter_config)
    out = save_drafter(model, tmp_path / "d")
    raw = json.loads((out / "config.json").read_text())
    raw["num_hidden_layers"] = 3
    raw["layer_types"] = ["full_attention"] * 3
    (out / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match="missing .*layers.2"):
        load_drafter(out)
    raw["architectures"] = ["Qwen3ForCausalLM"]
    (out / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match="architectures"):
        load_drafter(out)


def test_gradients_reach_only_drafter_parameters(tiny_target, tiny_tokenizer, tiny_drafter_config):
    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_drafter_config).train()
    features, noise, positions = _inputs(tiny_target, tiny_tokenizer, tiny_drafter_config)
    hidden = model(position_ids=positions, noise_embedding=noise, target_hidden=features)
    model.compute_logits(hidden, target_lm_head(tiny_target)).logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    tiny_target.zero_grad(set_to_none=True)


def test_gradient_checkpointing_keeps_gradients(tiny_drafter_config):
    torch.manual_seed(0)
    model = DFlashDraftModel(tiny_drafter_config)
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()
    noise = torch.randn(1, 8, 128)
    context = torch.randn(1, 5, len(tiny_drafter_config.target_layer_ids) * 128)
    model(position_ids=torch.arange(13)[None], noise_embedding=noise, target_hidden=context).square().mean().backward()
    assert model.layers[0].gradient_checkpointing
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "norm" not in n)


def test_a_sliding_window_drafter_trains_and_decodes_with_the_same_window(tiny_target, tiny_drafter_config):
    # The config carries the window the way engines read it; the training layout and the cached
    # inference path both apply it, so a block scored in training equals the block drafted with a cache.
    from transformers import DynamicCache

    from draftsmith.model.block_attention import BlockLayout
    from draftsmith.model.config import layer_windows

    window, block = 10, 8
    config = build_drafter_config(tiny_target.config, num_draft_layers=2, block_size=block,
                                  mask_token_id=tiny_drafter_config.mask_token_id, sliding_window=window)
    assert config.layer_types == ["sliding_attention"] * 2 and config.sliding_window == window
    assert config.use_sliding_window and config.is_causal is False and config.dflash_config["causal"] is False
    assert config.dflash_config["trained_windows"] == [window, window] == layer_windows(config)
    with pytest.raises(ValueError, match="at least the block size"):
        build_drafter_config(tiny_target.config, block_size=block, mask_token_id=1, sliding_window=block - 1)
    torch.manual_seed(0)
    windowed = DFlashDraftModel(config).eval()
    full = DFlashDraftModel(tiny_drafter_config).eval()
    full.load_state_dict(windowed.state_dict())
    hidden = config.hidden_size
    generator = torch.Generator().manual_seed(3)
    context, anchor = 30, 25  # the block at 25..32 sees context 25+k-9..24 only
    features = torch.randn(1, context, len(config.target_layer_ids) * hidden, generator=generator)
    noise = torch.randn(1, block, hidden, generator=generator)
    with torch.no_grad():
        layout = BlockLayout(torch.tensor([[anchor]]), torch.tensor([[True]]), context, block)
        positions = torch.cat([torch.arange(context), torch.arange(anchor, anchor + block)]).unsqueeze(0)
        trained = windowed(position_ids=positions, attention_mask=layout, noise_embedding=noise, target_hidden=features)
        unwindowed = full(position_ids=positions, attention_mask=layout, noise_embedding=noise, target_hidden=features)
        assert (trained - unwindowed).abs().max() > 1e-4  # the window changes what the block sees
        # Inference: the context up to the anchor in the cache (two calls), then the block.
        cache = DynamicCache()
        windowed(position_ids=torch.arange(12 + block).unsqueeze(0), noise_embedding=noise, target_hidden=features[:, :12],
                 past_key_values=cache, use_cache=True)
        cache.crop(-block)
        drafted = windowed(position_ids=torch.arange(12, anchor + block).unsqueeze(0), noise_embedding=noise,
                           target_hidden=features[:, 12:anchor], past_key_values=cache, use_cache=True)
    torch.testing.assert_close(drafted, trained, atol=1e-5, rtol=1e-4)
