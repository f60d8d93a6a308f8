"""Loss masks on the tiny Qwen3-style template: exact spans, traps, other templates, engine ids."""

from __future__ import annotations

import numpy as np
import pytest

from draftsmith.data.sources import Record
from draftsmith.tokenize.masking import RowDropped
from draftsmith.tokenize.pipeline import masker_row
from chat_templates import SMOLLM2_DEFAULT_SYSTEM, SMOLLM2_TEMPLATE, tool_call_template
from tokenize_helpers import CHATML_TEMPLATE, generation_marker_template, tokenizer_with_template

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "Reverse the word tiger."}
REASONING = "The word is tiger. Its letters are t i g e r. Read backwards they are r e g i t."
ANSWER = "The reversed word is regit."


def row(messages, **extra):
    return masker_row(Record("test.jsonl:1", row={"id": "r1", "messages": messages, **extra}))


def assistant(content=ANSWER, reasoning=REASONING):
    """reasoning=None: the turn has no think block; "": the model wrote an empty one."""
    if reasoning is None:
        return {"role": "assistant", "content": content}
    return {"role": "assistant", "content": content, "reasoning_content": reasoning}


def trained_text(masker, built) -> str:
    ids = built.input_ids[built.loss_mask == 1].tolist()
    return masker.tokenizer.decode(ids, skip_special_tokens=False)


def untrained_prefix(masker, built) -> str:
    first = int(np.flatnonzero(built.loss_mask)[0])
    return masker.tokenizer.decode(built.input_ids[:first].tolist(), skip_special_tokens=False)


def test_final_turn_trains_thinking_answer_and_end_of_turn_exactly(make_masker):
    masker = make_masker()
    messages = [SYSTEM, USER, assistant()]
    built = masker.build(row(messages))
    assert built.method == "template_prefix" and built.verified
    assert trained_text(masker, built) == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"
    # No off-by-one: everything before the first trained token is exactly the generation prompt.
    prompt = masker.tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    assert untrained_prefix(masker, built) == prompt
    first = int(np.flatnonzero(built.loss_mask)[0])
    assert masker.tokenizer.convert_ids_to_tokens(int(built.input_ids[first])) == "<think>"
    # The row ends with the generated <|im_end|>: the newline the template renders after it is
    # scaffolding the model never generates (an engine's ids end there too).
    assert built.loss_mask[-1] == 1
    assert masker.tokenizer.decode([int(built.input_ids[-1])], skip_special_tokens=False) == "<|im_end|>"
    assert masker.render(messages).endswith(trained_text(masker, built) + "\n")
    assert built.input_ids.dtype == np.int32 and built.loss_mask.dtype == np.int8
    assert len(built.input_ids) == len(built.loss_mask)


def test_template_inserted_empty_think_block_is_not_trained(make_masker, tiny_tokenizer):
    masker = make_masker()
    messages = [USER, assistant(reasoning=None)]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<think>\n\n</think>\n\n" in text  # the template does insert it
    built = masker.build(row(messages))
    assert trained_text(masker, built) == f"{ANSWER}<|im_end|>"
    think_id = tiny_tokenizer.convert_tokens_to_ids("<think>")
    end_think_id = tiny_tokenizer.convert_tokens_to_ids("</think>")
    for token_id in (think_id, end_think_id):
        positions = np.flatnonzero(built.input_ids == token_id)
        assert len(positions) == 1 and built.loss_mask[positions[0]] == 0


def test_missing_reasoning_field_behaves_like_empty_reasoning(make_masker):
    masker = make_masker()
    built = masker.build(row([USER, {"role": "assistant", "content": ANSWER}]))
    assert trained_text(masker, built) == f"{ANSWER}<|im_end|>"


def test_multi_turn_trains_only_the_final_turn_by_default(make_masker):
    masker = make_masker()
    earlier = assistant("In capital letters: HARBOR.", "The phrase is harbor.")
    messages = [SYSTEM, {"role": "user", "content": "Write harbor in capital letters."}, earlier, USER, assistant()]
    built = masker.build(row(messages))
    assert trained_text(masker, built) == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"
    runs = np.flatnonzero(np.diff(np.concatenate([[0], built.loss_mask, [0]])) == 1)
    assert len(runs) == 1


def test_all_turns_trains_earlier_answers_as_the_template_renders_them(make_masker):
    masker = make_masker(train_turns="all")
    earlier = assistant("In capital letters: HARBOR.", "The phrase is harbor.")
    messages = [{"role": "user", "content": "Write harbor in capital letters."}, earlier, USER, assistant()]
    built = masker.build(row(messages))
    # Qwen3-style templates drop the earlier turn's thinking, so only its answer is trained.
    assert trained_text(masker, built) == (
        f"In capital letters: HARBOR.<|im_end|><think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"
    )
    runs = np.flatnonzero(np.diff(np.concatenate([[0], built.loss_mask, [0]])) == 1)
    assert len(runs) == 2


def test_tool_messages_and_tool_call_turns(make_masker, tiny_tokenizer):
    masker = make_masker()
    messages = [
        SYSTEM,
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "I will look it up.", "reasoning_content": "I need the weather tool."},
        {"role": "tool", "content": '{"temperature": 21}'},
        assistant("It is 21 degrees in Paris.", "The tool says 21."),
    ]
    built = masker.build(row(messages))
    text = trained_text(masker, built)
    assert text == "<think>\nThe tool says 21.\n</think>\n\nIt is 21 degrees in Paris.<|im_end|>"
    untrained = masker.tokenizer.decode(built.input_ids[built.loss_mask == 0].tolist())
    assert "temperature" in untrained and "I will look it up." in untrained
    all_turns = make_masker(train_turns="all").build(row(messages))
    # After the last user message both assistant turns keep their thinking and are trained.
    assert trained_text(masker, all_turns) == (
        "<think>\nI need the weather tool.\n</think>\n\nI will look it up.<|im_end|>" + text
    )


def test_tool_calls_in_the_final_turn_are_trained(make_masker, tiny_target_dir):
    masker = make_masker(tokenizer=tokenizer_with_template(tiny_target_dir, tool_call_template()))
    call = {"type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    rendered_call = '\n<tool_call>\n{"name": "weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>'
    with_reasoning = {"role": "assistant", "content": "I will check.", "reasoning_content": "Use the tool.", "tool_calls": [call]}
    built = masker.build(row([USER, with_reasoning]))
    assert trained_text(masker, built) == f"<think>\nUse the tool.\n</think>\n\nI will check.{rendered_call}<|im_end|>"
    calls_only = {"role": "assistant", "content": None, "tool_calls": [call]}
    built = masker.build(row([USER, calls_only]))
    assert trained_text(masker, built) == f"{rendered_call}<|im_end|>"  # the empty think block stays 0



def test_a_tool_call_is_looked_for_in_its_own_turn_the_first_one_included(make_masker, tiny_target_dir):
    call = {"type": "function", "function": {"name": "weather", "arguments": {}}}
    opening = {"role": "assistant", "content": "", "tool_calls": [call]}  # a row that opens with a call
    messages = [opening, {"role": "tool", "content": "rain"}, USER, assistant(reasoning=None)]
    with_tools = make_masker(tokenizer=tokenizer_with_template(tiny_target_dir, tool_call_template()))
    assert trained_text(with_tools, with_tools.build(row(messages))) == f"{ANSWER}<|im_end|>"
    with pytest.raises(RowDropped, match="^tool_calls_not_rendered: turn 0: .* the tool call 'weather'"):
        make_masker().build(row(messages))

def test_content_text_that_also_appears_in_the_prompt_is_not_confused(make_masker):
    # The answer repeats the user's words: a substring search would find the prompt copy first.
    masker = make_masker()
    messages = [{"role": "user", "content": "regit"}, assistant(content="regit", reasoning=None)]
    built = masker.build(row(messages))
    assert trained_text(masker, built) == "regit<|im_end|>"
    assert untrained_prefix(masker, built).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_inline_think_tags_in_content_are_split(make_masker):
    masker = make_masker()
    content = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
    built = masker.build(row([USER, {"role": "assistant", "content": content}]))
    assert trained_text(masker, built) == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"


def test_generation_marker_template_uses_markers_and_still_masks_scaffolding(make_masker, tiny_target_dir):
    marked = make_masker(tokenizer=tokenizer_with_template(tiny_target_dir, generation_marker_template()))
    plain = make_masker()
    assert marked.has_generation_markers and not plain.has_generation_markers
    earlier = assistant("In capital letters: HARBOR.", "The phrase is harbor.")
    for messages in (
        [SYSTEM, USER, assistant()],
        [USER, assistant(reasoning=None)],  # markers cover the template's empty think block: must stay 0
        [USER, assistant(reasoning="")],  # the model wrote that block: trained both ways
        [{"role": "user", "content": "Write harbor."}, earlier, USER, assistant()],  # markers cover every turn
    ):
        by_markers = marked.build(row(messages))
        by_prefix = plain.build(row(messages))
        assert by_markers.method == "generation_markers"
        assert by_markers.input_ids.tolist() == by_prefix.input_ids.tolist()
        assert by_markers.loss_mask.tolist() == by_prefix.loss_mask.tolist()


def test_generation_markers_can_be_turned_off(make_masker, tiny_target_dir):
    tokenizer = tokenizer_with_template(tiny_target_dir, generation_marker_template())
    built = make_masker(tokenizer=tokenizer, use_generation_markers=False).build(row([USER, assistant()]))
    assert built.method == "template_prefix"


def test_chatml_template_without_markers_or_reasoning(make_masker, tiny_target_dir):
    masker = make_masker(tokenizer=tokenizer_with_template(tiny_target_dir, CHATML_TEMPLATE))
    built = masker.build(row([SYSTEM, USER, assistant(reasoning=None)]))
    assert built.method == "template_prefix"
    assert trained_text(masker, built) == f"{ANSWER}<|im_end|>"
    assert 0 < built.loss_mask.sum() < len(built.loss_mask)


@pytest.mark.parametrize("with_system", [False, True], ids=["default-system-prompt", "own-system-prompt"])
def test_smollm2_template_inserting_a_default_system_prompt_masks_exactly(make_masker, tiny_target_dir, with_system):
    masker = make_masker(tokenizer=tokenizer_with_template(tiny_target_dir, SMOLLM2_TEMPLATE))
    earlier = [USER, assistant("An earlier answer.", reasoning=None), {"role": "user", "content": "And again?"}]
    messages = ([SYSTEM] if with_system else []) + earlier + [assistant(reasoning=None)]
    built = masker.build(row(messages))
    assert built.verified
    assert trained_text(masker, built) == f"{ANSWER}<|im_end|>"
    prefix = untrained_prefix(masker, built)
    assert prefix == masker.tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    assert (SMOLLM2_DEFAULT_SYSTEM in prefix) is not with_system
    assert prefix.endswith("<|im_start|>user\nAnd again?<|im_end|>\n<|im_start|>assistant\n")
    assert masker.render(messages).endswith(trained_text(masker, built) + "\n")


ANSWER_ONLY_TEMPLATE = (
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}{{- m.content + '<|im_end|>' -}}"
    "{%- endif -%}{%- endfor -%}"
)


@pytest.mark.parametrize(
    "template, reasoning, reason",
    [
        # A template without a place for reasoning would silently lose the thinking.
        (CHATML_TEMPLATE, REASONING, "reasoning_not_rendered"),
        # Nothing but the answer is rendered: the mask would be all ones.
        (ANSWER_ONLY_TEMPLATE, "", "mask_all_ones"),
        # The assistant turn is rendered differently from the generation prompt.
        (CHATML_TEMPLATE.replace("'<|im_start|>assistant\\n'", "'<|im_start|>bot\\n'"), "", "template_mismatch"),
        # Turns end without an end-of-turn token: where the turn stops is unknown.
        (CHATML_TEMPLATE.replace("'<|im_end|>\\n'", "'\\n\\n'"), "", "no_end_of_turn"),
    ],
    ids=["drops-reasoning", "answer-only", "different-header", "no-end-of-turn"],
)
def test_templates_that_cannot_be_masked_exactly_are_caught(make_masker, tiny_target_dir, template, reasoning, reason):
    assert template != CHATML_TEMPLATE or reason == "reasoning_not_rendered"
    masker = make_masker(tokenizer=tokenizer_with_template(tiny_target_dir, template))
    with pytest.raises(RowDropped) as caught:
        masker.build(row([USER, assistant(reasoning=reasoning)]))
    assert caught.value.reason == reason


def test_turn_boundary_inside_a_token_is_caught_not_shifted(make_masker, tiny_target_dir):
    # The generation prompt ends in "Re" and the answer starts "verse": BPE merges "Reverse"
    # across the boundary, so no token starts where the answer does.
    template = CHATML_TEMPLATE.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\nRe'").replace(
        "'<|im_start|>' + message.role + '\\n' + message.content",
        "'<|im_start|>' + message.role + '\\n' + ('Re' if message.role == 'assistant' else '') + message.content",
    )
    masker = make_masker(tokenizer=tokenizer_with_template(tiny_target_dir, template))
    text = masker.render([USER, assistant(content="verse the word.", reasoning="")])
    assert "Reverse" in masker.tokenizer.convert_ids_to_tokens(masker.tokenizer(text)["input_ids"])
    with pytest.raises(RowDropped) as caught:
        masker.build(row([USER, assistant(content="verse the word.", reasoning="")]))
    assert caught.value.reason == "span_misaligned"


def test_verification_catches_leaked_scaffolding(make_masker, monkeypatch):
    # If span finding regressed and trained the empty think block, decoding must catch it.
    masker = make_masker()
    monkeypatch.setattr(masker, "_empty_reasoning_scaffold", lambda *args: "")
    with pytest.raises(RowDropped) as caught:
        masker.build(row([USER, assistant(reasoning=None)]))
    assert caught.value.reason == "verify_failed" and "scaffolding" in caught.value.detail
    # With verification sampled away, the same bug goes unnoticed: that is what the share trades.
    unverified = make_masker(verify_share=0.0)
    monkeypatch.setattr(unverified, "_empty_reasoning_scaffold", lambda *args: "")
    assert not unverified.build(row([USER, assistant(reasoning=None)])).verified


def test_end_of_turn_token_inside_the_answer_is_caught(make_masker):
    with pytest.raises(RowDropped) as caught:
        make_masker().build(row([USER, assistant(content="Done.<|im_end|>More text.")]))
    assert caught.value.reason in {"special_token_in_content", "end_of_turn_in_content", "verify_failed"}


def test_rows_without_a_final_assistant_turn_or_with_empty_answers_are_dropped(make_masker):
    masker = make_masker()
    with pytest.raises(RowDropped) as caught:
        masker.build(row([SYSTEM, USER]))
    assert caught.value.reason == "no_assistant_turn"
    with pytest.raises(RowDropped) as caught:
        masker.build(row([USER, assistant(content="", reasoning="")]))
    assert caught.value.reason == "empty_assistant"
    with pytest.raises(RowDropped) as caught:
        make_masker(train_turns="all").build(row([assistant()]))
    assert caught.value.reason == "no_assistant_turn"


def test_length_policy(make_masker):
    messages = [USER, assistant()]
    with pytest.raises(RowDropped) as caught:
        make_masker().build(row(messages, finish_reason="length"))
    assert caught.value.reason == "finish_reason_length"
    masker = make_masker(length_policy="keep")
    kept = masker.build(row(messages, finish_reason="length"))
    # The model never wrote the end-of-turn the template closes the turn with.
    assert trained_text(masker, kept) == f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
    assert kept.loss_mask[-1] == 1 and kept.finish_reason == "length"
    cut_in_thinking = masker.build(row([USER, assistant(content="", reasoning="The word is tig")], finish_reason="length"))
    assert trained_text(masker, cut_in_thinking) == "<think>\nThe word is tig"


def test_max_length_drop_and_truncate(make_masker):
    messages = [SYSTEM, USER, assistant()]
    full = make_masker().build(row(messages))
    limit = len(full.input_ids) - 5
    with pytest.raises(RowDropped) as caught:
        make_masker(max_length=limit).build(row(messages))
    assert caught.value.reason == "overflow"
    truncated = make_masker(max_length=limit, overflow="truncate").build(row(messages))
    assert truncated.truncated and len(truncated.input_ids) == limit
    assert truncated.input_ids.tolist() == full.input_ids[:limit].tolist()
    assert truncated.loss_mask.tolist() == full.loss_mask[:limit].tolist()
    prompt_length = int(np.flatnonzero(full.loss_mask)[0])
    with pytest.raises(RowDropped) as caught:
        make_masker(max_length=prompt_length, overflow="truncate").build(row(messages))
    assert caught.value.reason == "truncated_no_trainable"


def _engine_ids(tokenizer, messages, completion_text):
    prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    return (
        tokenizer(prompt, add_special_tokens=False)["input_ids"],
        tokenizer(completion_text, add_special_tokens=False)["input_ids"],
    )


def test_engine_token_ids_are_used_directly(make_masker, tiny_tokenizer):
    masker = make_masker()
    messages = [USER, assistant()]
    completion = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>"
    prompt_ids, completion_ids = _engine_ids(tiny_tokenizer, messages, completion)
    built = masker.build(row(messages, prompt_token_ids=prompt_ids, completion_token_ids=completion_ids, finish_reason="stop"))
    assert built.method == "engine_token_ids" and not built.end_of_turn_appended
    assert built.input_ids.tolist() == prompt_ids + completion_ids
    assert built.loss_mask.tolist() == [0] * len(prompt_ids) + [1] * len(completion_ids)
    # Without the end-of-turn id (some engines leave it out) it is appended for a stopped turn.
    appended = masker.build(row(messages, prompt_token_ids=prompt_ids, completion_token_ids=completion_ids[:-1], finish_reason="stop"))
    assert appended.end_of_turn_appended and appended.input_ids.tolist() == prompt_ids + completion_ids
    # ... and not for one cut by max_tokens.
    cut = make_masker(length_policy="keep").build(
        row(messages, prompt_token_ids=prompt_ids, completion_token_ids=completion_ids[:-1], finish_reason="length")
    )
    assert cut.input_ids.tolist() == prompt_ids + completion_ids[:-1]
    # Turned off, the same row is rendered through the template instead.
    templated = make_masker(use_engine_token_ids=False).build(
        row(messages, prompt_token_ids=prompt_ids, completion_token_ids=completion_ids)
    )
    assert templated.method == "template_prefix"


def test_engine_token_ids_that_do_not_fit_are_dropped(make_masker, tiny_tokenizer):
    masker = make_masker()
    messages = [USER, assistant()]
    prompt_ids, completion_ids = _engine_ids(tiny_tokenizer, messages, f"{ANSWER}<|im_end|>")
    with pytest.raises(RowDropped) as caught:
        masker.build(row(messages, prompt_token_ids=prompt_ids, completion_token_ids=completion_ids + [len(tiny_tokenizer) + 5]))
    assert caught.value.reason == "engine_ids_invalid"
    other_ids = tiny_tokenizer("Something else entirely.<|im_end|>", add_special_tokens=False)["input_ids"]
    with pytest.raises(RowDropped) as caught:
        masker.build(row(messages, prompt_token_ids=prompt_ids, completion_token_ids=other_ids))
    assert caught.value.reason == "engine_ids_mismatch"


def test_engine_token_ids_of_another_prompt_or_count_are_dropped(make_masker, tiny_tokenizer):
    """The row's engine ids are checked against the row itself: the prompt they decode to, and the
    engine's own usage counts (issue 27, item 3)."""
    masker = make_masker()
    messages = [USER, assistant()]
    prompt_ids, completion_ids = _engine_ids(tiny_tokenizer, messages, f"{ANSWER}<|im_end|>")
    whole = masker.build(row(messages, prompt_token_ids=prompt_ids, completion_token_ids=completion_ids,
                             prompt_tokens=len(prompt_ids), completion_tokens=len(completion_ids) + 1))  # fmt: skip
    assert whole.method == "engine_token_ids"
    other_prompt, _ = _engine_ids(tiny_tokenizer, [{"role": "user", "content": "Name a colour."}, assistant()], ANSWER)
    cases = [
        ({"prompt_token_ids": other_prompt, "completion_token_ids": completion_ids}, "prompt_token_ids do not decode"),
        ({"prompt_token_ids": prompt_ids, "completion_token_ids": completion_ids, "prompt_tokens": len(prompt_ids) + 9},
         "prompt_token_ids holds"),
        ({"prompt_token_ids": prompt_ids, "completion_token_ids": completion_ids[:3], "completion_tokens": len(completion_ids)},
         "completion_token_ids holds 3 ids"),
    ]
    for fields, detail in cases:
        with pytest.raises(RowDropped) as caught:
            masker.build(row(messages, finish_reason="stop", **fields))
        assert caught.value.reason == "engine_ids_mismatch" and detail in str(caught.value), (fields, caught.value)


def test_synthetic_corpus_masks_decode_to_the_assistant_turn(make_masker):
    from draftsmith.tiny import synthetic_conversations

    masker = make_masker()
    for conversation in synthetic_conversations(60, seed=11):
        final = conversation["messages"][-1]
        built = masker.build(row(conversation["messages"]))
        assert trained_text(masker, built) == (
            f"<think>\n{final['reasoning_content']}\n</think>\n\n{final['content']}<|im_end|>"
        )


def test_enable_thinking_false_prompt_gives_the_same_mask(make_masker):
    # Rows generated with enable_thinking=False: the engine's prompt held the empty think block.
    messages = [USER, assistant(reasoning=None)]
    default = make_masker().build(row(messages))
    no_thinking_masker = make_masker(chat_template_kwargs=(("enable_thinking", False),))
    no_thinking = no_thinking_masker.build(row(messages))
    assert no_thinking.input_ids.tolist() == default.input_ids.tolist()
    assert no_thinking.loss_mask.tolist() == default.loss_mask.tolist()
    # A generated row records its (empty) reasoning as "": the block sits in that prompt, so the
    # model did not write it and it stays 0 whichever way the row says it.
    recorded = no_thinking_masker.build(row([USER, assistant(reasoning="")]))
    assert recorded.loss_mask.tolist() == default.loss_mask.tolist()


def test_empty_think_block_the_model_wrote_is_trained(make_masker):
    masker = make_masker()
    built = masker.build(row([USER, assistant(reasoning="")]))
    assert trained_text(masker, built) == f"<think>\n\n</think>\n\n{ANSWER}<|im_end|>"
    assert built.verified
    # Written inline, as an engine without a reasoning parser returns it: the same row.
    inline = masker.build(row([USER, {"role": "assistant", "content": f"<think>\n\n</think>\n\n{ANSWER}"}]))
    assert inline.input_ids.tolist() == built.input_ids.tolist()
    assert inline.loss_mask.tolist() == built.loss_mask.tolist()


def test_end_of_turn_from_generation_config_or_option(tmp_path, tiny_target_dir, tiny_tokenizer):
    import json as _json

    from draftsmith.core.errors import InputError
    from draftsmith.tokenize.masking import ChatMasker, MaskerConfig

    # A Llama-3-like setup: turns end with a token that is not the tokenizer's eos. The template
    # names it, so no flag is needed (this row was dropped as no_end_of_turn before).
    template = CHATML_TEMPLATE.replace("'<|im_end|>\\n'", "'<|endoftext|>\\n'")
    tokenizer = tokenizer_with_template(tiny_target_dir, template)
    messages = [USER, assistant(reasoning="")]
    end_id = tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    (tmp_path / "generation_config.json").write_text(_json.dumps({"eos_token_id": [tiny_tokenizer.eos_token_id, end_id]}))
    for masker in (
        ChatMasker(tokenizer, MaskerConfig(), tiny_target_dir),
        ChatMasker(tokenizer, MaskerConfig(), tmp_path),
        ChatMasker(tokenizer, MaskerConfig(end_of_turn_tokens=("<|endoftext|>",)), tiny_target_dir),
    ):
        built = masker.build(row(messages))
        assert trained_text(masker, built) == f"{ANSWER}<|endoftext|>"
    with pytest.raises(InputError, match="not in the tokenizer"):
        ChatMasker(tokenizer, MaskerConfig(end_of_turn_tokens=("<|nope|>",)), tiny_target_dir)


def test_row_tools_reach_the_chat_template(make_masker, tiny_target_dir):
    from draftsmith.tiny import chat_template

    tools_header = (
        '{%- if tools -%}{{- "<|im_start|>system\\n# Tools\\n" -}}'
        '{%- for tool in tools -%}{{- tool.function.name + "\\n" -}}{%- endfor -%}'
        '{{- "<|im_end|>\\n" -}}{%- endif -%}'
    )
    masker = make_masker(tokenizer_with_template(tiny_target_dir, tools_header + chat_template()))
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    built = masker.build(row([USER, assistant()], tools=[tool]))
    text = masker.tokenizer.decode(built.input_ids.tolist(), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n# Tools\nget_weather\n")
    assert "get_weather" not in trained_text(masker, built) and built.verified
    plain = masker.build(row([USER, assistant()]))
    assert "get_weather" not in masker.tokenizer.decode(plain.input_ids.tolist(), skip_special_tokens=False)


def test_a_gguf_style_gemma_tokenizes_without_flags_and_closes_turns_with_end_of_turn(tmp_path):
    """Gemma as its GGUF converts: eos <eos> (generation_config says only it), while the template
    ends turns with <end_of_turn>. Every row was dropped (no_end_of_turn) unless --end-of-turn was given."""
    from draftsmith.tiny.families import build_family_target
    from draftsmith.tokenize.masking import ChatMasker

    target = build_family_target("gemma3-gguf", tmp_path / "gemma")
    masker = ChatMasker.from_path(target)
    tokenizer = masker.tokenizer
    eos, turn_end = tokenizer.convert_tokens_to_ids("<eos>"), tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert tokenizer.eos_token_id == eos
    built = masker.build(row([USER, assistant(reasoning=None)]))
    assert trained_text(masker, built) == f"{ANSWER}<end_of_turn>"
    # An engine row without its end token is closed with the template's, not with <eos>.
    prompt = tokenizer.apply_chat_template([USER], tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    engine = masker.build(row([USER, assistant(reasoning=None)], prompt_token_ids=prompt_ids,
                              completion_token_ids=answer_ids, finish_reason="stop"))
    assert engine.end_of_turn_appended and int(engine.input_ids[-1]) == turn_end
