"""A turn's end comes from the chat template: the token it writes after an assistant's content,
on every tiny family (Gemma as its GGUF carries it: eos <eos>, turns end with <end_of_turn>) and
on SmolLM2 (tests/models)."""

from __future__ import annotations

import pytest

from draftsmith.data.turns import end_of_turn_ids, generation_eos_ids, template_end_of_turn_ids
from draftsmith.tiny.families import FAMILIES, build_family_tokenizer

# The token each family's template closes an assistant turn with.
TURN_END = {"llama3": "<|eot_id|>", "qwen2.5": "<|im_end|>", "qwen3": "<|im_end|>", "gemma3": "<end_of_turn>",
            "gemma3-gguf": "<end_of_turn>", "mistral": "</s>", "mistral-nopad": "</s>"}


def test_every_family_is_named_here():
    assert set(TURN_END) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_ends_its_turns_with_the_token_its_template_writes(family):
    tokenizer = build_family_tokenizer(FAMILIES[family])
    turn_end = tokenizer.convert_tokens_to_ids(TURN_END[family])
    assert template_end_of_turn_ids(tokenizer) == [turn_end]
    stops = end_of_turn_ids(tokenizer)
    assert stops[0] == turn_end and tokenizer.eos_token_id in stops  # the template's first: what closes a turn
    assert len(stops) == len(set(stops))


def test_a_gguf_style_gemma_stops_at_end_of_turn_though_its_eos_is_another_token():
    tokenizer = build_family_tokenizer(FAMILIES["gemma3-gguf"])
    eos, turn_end = tokenizer.convert_tokens_to_ids("<eos>"), tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert tokenizer.eos_token_id == eos != turn_end
    assert end_of_turn_ids(tokenizer) == [turn_end, eos]
    assert end_of_turn_ids(tokenizer, extra=[eos, 7]) == [turn_end, eos, 7]
    # generation_config.json as Gemma's own lists it: eos first, then the turn's end.
    assert generation_eos_ids(tokenizer) == [eos, turn_end]


def test_the_qwen3_template_ends_a_thinking_turn_with_im_end(tiny_tokenizer):
    turn_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert template_end_of_turn_ids(tiny_tokenizer) == [turn_end]
    assert template_end_of_turn_ids(tiny_tokenizer, {"enable_thinking": False}) == [turn_end]


def test_templates_that_write_no_special_token_after_the_content_give_none(tiny_tokenizer):
    tokenizer = build_family_tokenizer(FAMILIES["gemma3-gguf"])
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tokenizer.chat_template = plain
    assert template_end_of_turn_ids(tokenizer) == []
    assert end_of_turn_ids(tokenizer) == [tokenizer.eos_token_id]  # the eos alone, as before
    tokenizer.chat_template = "{{ raise_exception('no') }}"
    assert template_end_of_turn_ids(tokenizer) == []
    tokenizer.chat_template = None
    assert template_end_of_turn_ids(tokenizer) == []


def test_a_template_that_insists_on_a_system_turn_is_probed_with_one():
    tokenizer = build_family_tokenizer(FAMILIES["gemma3-gguf"])
    tokenizer.chat_template = ("{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
                               + FAMILIES["gemma3-gguf"].template)
    assert template_end_of_turn_ids(tokenizer) == [tokenizer.convert_tokens_to_ids("<end_of_turn>")]
