"""SmolLM2's turn end, read from its chat template: `<|im_end|>` (2), its eos too, so convert
writes one id and tokenize and eval stop where they always did."""

from __future__ import annotations


def test_smollm2_ends_its_turns_with_im_end(smollm2):
    from transformers import AutoTokenizer

    from draftsmith.data.turns import end_of_turn_ids, generation_eos_ids, template_end_of_turn_ids
    from draftsmith.tokenize.masking import ChatMasker

    tokenizer = AutoTokenizer.from_pretrained(smollm2.hf_dir)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end == 2 == tokenizer.eos_token_id
    assert template_end_of_turn_ids(tokenizer) == [2]
    assert end_of_turn_ids(tokenizer) == [2] and generation_eos_ids(tokenizer) == [2]
    masker = ChatMasker.from_path(smollm2.hf_dir)
    assert masker.end_of_turn_ids == frozenset({2}) and masker.primary_end_of_turn == 2
