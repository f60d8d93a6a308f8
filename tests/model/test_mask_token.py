"""The mask token is chosen from the target when its tokenizer has no <|MASK|>: one rule, printed."""

from __future__ import annotations

import pytest

from draftsmith.model.features import choose_mask_token, mask_token_for
from draftsmith.tiny.families import FAMILIES, build_family_target, build_family_tokenizer


@pytest.fixture(scope="module")
def tokenizers():
    return {name: build_family_tokenizer(family) for name, family in FAMILIES.items()}


def test_the_tokenizers_own_mask_token_comes_first(tiny_tokenizer):
    choice = choose_mask_token(tiny_tokenizer, len(tiny_tokenizer))
    assert (choice.token, choice.source) == ("<|MASK|>", "mask_token")
    assert choice.token_id == tiny_tokenizer.convert_tokens_to_ids("<|MASK|>")


def test_a_padded_embedding_table_gives_its_first_padding_row(tokenizers):
    tokenizer = tokenizers["qwen2.5"]
    choice = choose_mask_token(tokenizer, len(tokenizer) + 32)
    assert (choice.token_id, choice.token, choice.source) == (len(tokenizer), None, "padding_row")


def test_an_unused_reserved_token_is_next_and_never_one_the_template_uses(tokenizers):
    llama = tokenizers["llama3"]
    choice = choose_mask_token(llama, len(llama))
    assert (choice.token, choice.source) == ("<|reserved_special_token_3|>", "reserved_token")
    gemma = tokenizers["gemma3"]
    assert choose_mask_token(gemma, len(gemma)).token == "<unused1>"
    # A reserved token the chat template renders is in use: the next one is taken.
    llama.chat_template += "{{ '<|reserved_special_token_3|>' }}"
    assert choose_mask_token(llama, len(llama)).token == "<|reserved_special_token_2|>"


def test_a_pad_token_distinct_from_eos_is_the_last_resort_and_none_is_refused(tokenizers):
    mistral = tokenizers["mistral"]
    choice = choose_mask_token(mistral, len(mistral))
    assert (choice.token, choice.source) == ("<pad>", "pad_token")
    mistral.pad_token = mistral.eos_token
    assert choose_mask_token(mistral, len(mistral)) is None


def test_mask_token_for_prints_the_choice_and_names_a_target_without_one(tmp_path, capsys):
    from draftsmith.core.errors import InputError

    target = build_family_target("llama3", tmp_path / "llama3")
    choice = mask_token_for(target)
    assert "mask token id" in capsys.readouterr().err and choice.source == "reserved_token"
    assert mask_token_for(target, override=3).source == "override"
    with pytest.raises(InputError, match="--mask-token-id 999999 is outside"):
        mask_token_for(target, override=999999)


def test_the_drafter_config_ties_its_head_as_the_target_does(tiny_target):
    from transformers import Gemma3TextConfig

    from draftsmith.model import build_drafter_config

    tied = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    assert build_drafter_config(tied, num_draft_layers=1, mask_token_id=3).tie_word_embeddings is True
    assert build_drafter_config(tiny_target.config, num_draft_layers=1, mask_token_id=3).tie_word_embeddings is False
    # Gemma 3 keeps RoPE per layer type; the drafter's full-attention layers take the full-attention set.
    rope = build_drafter_config(tied, num_draft_layers=1, mask_token_id=3).rope_parameters
    assert rope == tied.rope_parameters["full_attention"]
