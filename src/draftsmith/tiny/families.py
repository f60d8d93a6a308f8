"""Tiny random-weight targets of the released architecture families, for tests without downloads.

Each family gets transformers' own config class with the traits that differ between families
(Llama 3's rope scaling and reserved special tokens, Qwen's padded embedding table, Gemma 3's
sliding-window layers, tied and scaled embeddings and per-layer-type RoPE, its GGUF's eos that is not
the template's end of turn, Mistral's pad token, and Mistral v0.1's lack of any spare id),
a small BPE tokenizer (tiny.build) and a chat template of its own kind. The weights are random:
what the tests check (train, lossless eval, export, check) does not need a trained target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LLAMA3 = (
    "{{- bos_token }}{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_GEMMA3 = (
    "{{ bos_token }}{%- for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
_MISTRAL = (
    "{{- bos_token }}{%- for m in messages %}{%- if m['role'] == 'user' %}[INST] {{ m['content'] }}[/INST]"
    "{%- elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{%- endif %}{%- endfor %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    config_class: str  # a transformers config class name
    special_tokens: list[str]
    roles: dict[str, str | None]
    template: str | None  # None: the tiny Qwen3 template (with its enable_thinking switch)
    padding_rows: int = 0  # embedding rows past the tokenizer (Qwen pads its table)
    added_tokens: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)


_RESERVED = [f"<|reserved_special_token_{i}|>" for i in range(4)]
FAMILIES: dict[str, Family] = {
    "llama3": Family(
        "llama3", "LlamaConfig",
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", *_RESERVED],
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": None, "unk_token": None},
        _LLAMA3,
        fields={"tie_word_embeddings": False, "rope_parameters": {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256}},
    ),
    "qwen2.5": Family(
        "qwen2.5", "Qwen2Config", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None},
        _CHATML, padding_rows=32, fields={"tie_word_embeddings": True, "rope_theta": 1000000.0},
    ),
    "qwen3": Family(
        "qwen3", "Qwen3Config", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None},
        None, padding_rows=32, added_tokens=["<think>", "</think>"], fields={"tie_word_embeddings": True},
    ),
    "gemma3": Family(
        "gemma3", "Gemma3TextConfig",
        ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<unused0>", "<unused1>"],
        {"bos_token": "<bos>", "eos_token": "<end_of_turn>", "pad_token": "<pad>", "unk_token": "<unk>"},
        _GEMMA3,
        fields={"tie_word_embeddings": True, "sliding_window": 8, "query_pre_attn_scalar": 16,
                "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]},
    ),
    # Gemma 3 as its GGUF carries it: the eos is `<eos>` while the template ends each turn with
    # `<end_of_turn>`, a distinct id only the template names; and the tokenizer's own `<mask>`.
    "gemma3-gguf": Family(
        "gemma3-gguf", "Gemma3TextConfig",
        ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<unused0>", "<unused1>"],
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
        _GEMMA3,
        fields={"tie_word_embeddings": True, "sliding_window": 8, "query_pre_attn_scalar": 16,
                "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]},
    ),
    "mistral": Family(
        "mistral", "MistralConfig", ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<pad>"],
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"},
        _MISTRAL, fields={"tie_word_embeddings": False, "sliding_window": None},
    ),
    # Mistral 7B v0.1's shape: no pad token, no reserved ids, the tokenizer fills the embedding
    # table exactly; no id is spare, so the drafter gets its own mask embedding.
    "mistral-nopad": Family(
        "mistral-nopad", "MistralConfig", ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": None, "unk_token": "<unk>"},
        _MISTRAL, fields={"tie_word_embeddings": False, "sliding_window": None},
    ),
}


def build_family_tokenizer(family: Family, vocab_size: int = 384, seed: int = 0):
    """The family's tokenizer: BPE on the synthetic corpus, its special tokens, roles and template."""
    from draftsmith.tiny.build import build_tokenizer
    from draftsmith.tiny.corpus import synthetic_conversations

    texts = [message["content"] for row in synthetic_conversations(300, seed=seed) for message in row["messages"]]
    extra = [token for token in family.special_tokens if token not in family.roles.values()]
    return build_tokenizer(texts, vocab_size, special_tokens=family.special_tokens, roles=family.roles,
                           additional_special_tokens=extra, added_tokens=family.added_tokens,
                           template=family.template)


def build_family_target(name: str, out_dir: str | Path, seed: int = 0, **sizes: int) -> Path:
    """Write a tiny random-weight target of family `name` (see FAMILIES) to `out_dir`; `sizes`
    override the config's (vLLM CPU's attention needs head_dim >= 32)."""
    import torch
    import transformers

    family = FAMILIES[name]
    tokenizer = build_family_tokenizer(family, seed=seed)
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, **sizes}
    config = getattr(transformers, family.config_class)(
        vocab_size=len(tokenizer) + family.padding_rows, **shape,
        max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **family.fields,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.do_sample = False
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
