"""The config reader's parameter counts agree with meta-device transformers models built from the same
configs (dense, MoE, hybrid), and it reads nested `text_config`, sliding windows, MTP and bad configs."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from draftsmith.core.errors import InputError
from draftsmith.plan.architecture import FULL, LINEAR, SLIDING, read_architecture

SMALL = dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1000)
LINEAR_SHAPE = dict(linear_num_value_heads=8, linear_num_key_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)
MOE = dict(moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4)
CONFIGS = {
    # kind, transformers config class, its arguments
    "qwen3 (dense)": ("Qwen3Config", dict(**SMALL, intermediate_size=704)),
    "qwen2 (dense, qkv bias, tied)": ("Qwen2Config", dict(**SMALL, intermediate_size=704, tie_word_embeddings=True)),
    "llama (dense)": ("LlamaConfig", dict(**SMALL, intermediate_size=704)),
    "mistral (dense, sliding)": ("MistralConfig", dict(**SMALL, intermediate_size=704, sliding_window=128)),
    "gemma2 (dense, alternating sliding)": ("Gemma2Config", dict(**SMALL, intermediate_size=704, sliding_window=128)),
    "gemma3 (dense, 5:1 sliding)": ("Gemma3TextConfig", dict(SMALL, num_hidden_layers=12, intermediate_size=704, sliding_window=128)),
    "qwen3_moe (MoE, a dense layer)": ("Qwen3MoeConfig", dict(**SMALL, **MOE, intermediate_size=704, mlp_only_layers=[0])),
    "qwen2_moe (MoE, shared expert)": ("Qwen2MoeConfig", dict(**SMALL, **MOE, intermediate_size=704, shared_expert_intermediate_size=512)),
    "mixtral (MoE)": ("MixtralConfig", dict(**SMALL, intermediate_size=512, num_local_experts=8, num_experts_per_tok=2)),
    "qwen3_5 (hybrid)": ("Qwen3_5TextConfig", dict(**SMALL, **LINEAR_SHAPE, intermediate_size=704)),
    "qwen3_5_moe (hybrid MoE)": ("Qwen3_5MoeTextConfig", dict(**SMALL, **LINEAR_SHAPE, **MOE, shared_expert_intermediate_size=256)),
    "qwen3_next (hybrid MoE)": ("Qwen3NextConfig", dict(**SMALL, **LINEAR_SHAPE, **MOE, intermediate_size=704,
                                                          shared_expert_intermediate_size=256)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_count_agrees_with_a_meta_device_transformers_model(name, tmp_path):
    class_name, arguments = CONFIGS[name]
    config_class = getattr(transformers, class_name, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
    config = config_class(**arguments)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    expected = sum(parameter.numel() for parameter in model.parameters())
    ours = read_architecture(tmp_path).params()
    assert ours == pytest.approx(expected, rel=0.01)
    assert ours == expected  # exact today; the 1% above is the promise


def test_layer_kinds_of_the_small_configs(tmp_path):
    def kinds(class_name):
        directory = tmp_path / class_name
        getattr(transformers, class_name)(**CONFIGS[next(k for k, v in CONFIGS.items() if v[0] == class_name)][1]).save_pretrained(directory)
        return read_architecture(directory)

    gemma3 = kinds("Gemma3TextConfig")
    assert gemma3.layer_types == ([SLIDING] * 5 + [FULL]) * 2 and gemma3.sliding_window == 128
    hybrid = kinds("Qwen3_5TextConfig")
    assert hybrid.layer_types == [LINEAR, LINEAR, LINEAR, FULL] * 2
    moe = kinds("Qwen3MoeConfig")
    assert (moe.moe_layers, moe.num_experts, moe.experts_per_token) == (7, 16, 4)
    assert moe.expert_params() == 3 * 128 * 256


QWEN36_27B = {
    # Qwen/Qwen3.6-27B config.json (same layout as Qwen3.5-27B); the vision tower is not the language model.
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text", "attn_output_gate": True, "full_attention_interval": 4, "head_dim": 256,
        "hidden_size": 5120, "intermediate_size": 17408, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1, "num_attention_heads": 24, "num_hidden_layers": 64,
        "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": 248320,
    },
    "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16},
}


def write_qwen36(tmp_path):
    path = tmp_path / "Qwen3.6-27B"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(QWEN36_27B))
    return path


def test_qwen36_27b_from_its_nested_text_config(tmp_path):
    arch = read_architecture(write_qwen36(tmp_path))
    assert (arch.layers_of(LINEAR), arch.layers_of(FULL), arch.mtp_layers) == (48, 16, 1)
    assert arch.params() == 26_895_998_464  # 26.90B, as ROOFLINE.md says
    assert arch.role_params("embedding") == arch.role_params("lm_head") == 248_320 * 5120
    # The MTP layer: fc 2H->H, one gated full-attention layer, the dense MLP, its norms.
    attention = 5120 * 2 * 24 * 256 + 2 * 5120 * 4 * 256 + 24 * 256 * 5120 + 2 * 256
    assert arch.params(mtp=True) == 2 * 5120 * 5120 + attention + 3 * 5120 * 17408 + 5 * 5120


def test_qwen36_meta_model_agrees(tmp_path):
    text = QWEN36_27B["text_config"]
    config = transformers.Qwen3_5TextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert read_architecture(write_qwen36(tmp_path)).params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("drop, names", [
    ("hidden_size", "missing hidden_size (also looked in text_config); pass --params"),
    ("linear_num_value_heads", "missing linear_num_value_heads (also looked in text_config); pass --state-bytes"),
])
def test_a_config_it_cannot_read_names_the_field_and_the_override(tmp_path, drop, names):
    broken = json.loads(json.dumps(QWEN36_27B))
    del broken["text_config"][drop]
    (tmp_path / "config.json").write_text(json.dumps(broken))
    with pytest.raises(InputError, match=names.replace("(", r"\(").replace(")", r"\)")):
        read_architecture(tmp_path)


MLA_SMALL = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
                 intermediate_size=512, moe_intermediate_size=64, n_routed_experts=16, n_shared_experts=2,
                 num_experts_per_tok=4, first_k_dense_replace=2, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=16,
                 qk_nope_head_dim=32, v_head_dim=32, n_group=4, topk_group=2)


@pytest.mark.parametrize("class_name, arguments", [
    ("DeepseekV3Config", MLA_SMALL),
    ("DeepseekV3Config", dict(MLA_SMALL, q_lora_rank=None, first_k_dense_replace=0, n_shared_experts=1)),
    ("DeepseekV2Config", dict(MLA_SMALL, n_group=1, topk_group=1)),
])
def test_mla_parameter_count_agrees_with_a_meta_device_transformers_model(tmp_path, class_name, arguments):
    config_class = getattr(transformers, class_name, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
    config = config_class(**arguments)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    arch = read_architecture(tmp_path)
    # transformers builds no MTP layer (it drops num_nextn_predict_layers' weights); the language model is exact.
    assert arch.params() == sum(parameter.numel() for parameter in model.parameters())
    assert arch.mla and arch.kv_elements_per_token() == 6 * (64 + 16)
    assert arch.moe_layers == 6 - arguments["first_k_dense_replace"] and arch.experts_per_token == 4
    assert not arch.warnings


# deepseek-ai/DeepSeek-V3 config.json (the fields that shape it; R1 has the same).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "n_group": 8, "topk_group": 4, "vocab_size": 129280,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def write_deepseek_v3(tmp_path):
    path = tmp_path / "DeepSeek-V3"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    return path


def test_deepseek_v3_caches_the_latent_and_the_rope_key(tmp_path):
    arch = read_architecture(write_deepseek_v3(tmp_path))
    assert arch.kv_elements_per_token() * 2 == (512 + 64) * 61 * 2 == 70_272  # bytes per token in bf16
    assert 2 * 128 * 128 * 61 * 2 > 25 * 70_272  # what the GQA formula would have said
    assert (arch.moe_layers, arch.num_experts, arch.experts_per_token, arch.mtp_layers) == (58, 256, 8, 1)
    # Hand count: MLA attention, 3 dense MLPs, 58 MoE layers (256 routed + 1 shared expert of 2048, a router).
    h = 7168
    attention = h * 1536 + 1536 * 128 * 192 + h * (512 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * h + 512 + 1536
    dense, expert = 3 * h * 18432, 3 * h * 2048
    moe = 256 * expert + expert + 256 * h
    params = 61 * (attention + 2 * h) + 3 * dense + 58 * moe + h + 2 * 129280 * h
    assert arch.params() == params
    assert round(params / 1e9, 1) == 671.0  # the published 671B (the MTP module's 14B besides)
    assert arch.expert_params() == expert
    mtp = 2 * h * h + attention + moe + 5 * h  # fc, an MLA + MoE layer, enorm/hnorm, its two norms, the head norm
    assert arch.params(mtp=True) == mtp


@pytest.mark.parametrize("change, field", [
    ({"num_hidden_layers": 10**9}, "num_hidden_layers 1,000,000,000 is beyond any real model's"),
    ({"num_hidden_layers": 10**6}, "num_hidden_layers 1,000,000 is beyond"),
    ({"vocab_size": 10**12}, "vocab_size"),
    ({"num_experts_per_tok": 300}, "num_experts_per_tok 300 is above n_routed_experts 256"),
    ({"first_k_dense_replace": 70}, "first_k_dense_replace 70 is above num_hidden_layers 61"),
    ({"kv_lora_rank": -512}, "kv_lora_rank must be a positive integer, got -512"),
    ({"n_routed_experts": "many"}, "n_routed_experts must be a whole number >= 0, got 'many'"),
    ({"num_key_value_heads": 3}, "num_key_value_heads 3 must divide num_attention_heads 128"),
    ({"mlp_only_layers": "0,1"}, "mlp_only_layers must be a list of layer indices, got '0,1'"),
    ({"mlp_only_layers": [0, 99]}, "mlp_only_layers names layer 99, outside the 61 layers"),
    ({"decoder_sparse_step": [2]}, "decoder_sparse_step must be a positive integer, got [2]"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer, got 0"),
    ({"model_type": "mamba"}, "model_type 'mamba' is a recurrent/state-space family"),
])
def test_inconsistent_or_unbounded_fields_are_refused_naming_file_and_field(tmp_path, change, field):
    path = write_deepseek_v3(tmp_path)
    (path / "config.json").write_text(json.dumps({**DEEPSEEK_V3, **change}))
    with pytest.raises(InputError) as raised:
        read_architecture(path)
    message = str(raised.value)
    assert message.startswith(f"{path / 'config.json'}: ") and field in message and "\n" not in message


@pytest.mark.parametrize("change, field", [
    ({"num_attention_heads": 512, "num_key_value_heads": 512}, "num_attention_heads 512 is above hidden_size 256 and no head_dim"),
    ({"num_attention_heads": 6, "num_key_value_heads": 6}, "hidden_size 256 is not a multiple of num_attention_heads 6"),
    ({"sliding_window": -4}, "sliding_window must be a whole number >= 0, got -4"),
    ({"sliding_window": 0}, "sliding_window must be a positive integer, got 0"),
    ({"num_experts": 4, "num_experts_per_tok": 8, "moe_intermediate_size": 64}, "num_experts_per_tok 8 is above num_experts 4"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types must list 8 (num_hidden_layers)"),
])
def test_a_dense_config_with_inconsistent_fields_is_refused(tmp_path, change, field):
    config = {"model_type": "gemma3_text", **SMALL, "intermediate_size": 704, "sliding_window": 128}
    del config["head_dim"]
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(InputError, match=field.replace("(", r"\(").replace(")", r"\)")):
        read_architecture(tmp_path)


def test_an_unmodeled_model_type_plans_from_its_fields_with_a_warning(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "olmo2", **SMALL, "intermediate_size": 704}))
    arch = read_architecture(tmp_path)
    assert len(arch.warnings) == 1 and "model_type 'olmo2' is not one plan engine models" in arch.warnings[0]


def test_kimi_k2_is_read_as_the_deepseek_v3_layout(tmp_path):
    # moonshotai/Kimi-K2-Instruct config.json: 64 heads, 384 routed experts, one dense layer, no MTP layer.
    kimi = dict(DEEPSEEK_V3, model_type="kimi_k2", num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384,
                first_k_dense_replace=1, vocab_size=163840, num_nextn_predict_layers=0, n_group=1, topk_group=1)
    (tmp_path / "config.json").write_text(json.dumps(kimi))
    arch = read_architecture(tmp_path)
    assert arch.kv_elements_per_token() * 2 == 70_272 and not arch.warnings
    assert (arch.moe_layers, arch.num_experts, arch.mtp_layers) == (60, 384, 0)
    assert round(arch.params() / 1e12, 2) == 1.03  # "1T total parameters"
