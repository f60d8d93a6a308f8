"""The Conversation model's rules: speakers, reasoning (one splitter, one unclosed rule), ids."""

from __future__ import annotations

import json

import pytest

from draftsmith.core.errors import InputError
from draftsmith.data.conversation import SPEAKERS, content_hash_id, conversation_from_row
from draftsmith.data.reasoning import separate


def final(content, **fields):
    row = {"id": "x", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": content, **fields}]}
    conversation = conversation_from_row(row, "t.jsonl:1")
    message = conversation.messages[-1]
    return message.get("reasoning_content"), message["content"], conversation.unclosed_think


@pytest.mark.parametrize(
    "content, fields, expected",
    [
        ("A.", {"reasoning_content": "R"}, ("R", "A.", False)),
        ("A.", {"reasoning": "R"}, ("R", "A.", False)),
        ("<think>\nR\n</think>\n\nA.", {}, ("R", "A.", False)),
        ("R\n</think>\n\nA.", {}, ("R", "A.", False)),  # the template pre-filled <think>
        ("<think>\n\n</think>\n\nA.", {}, ("", "A.", False)),  # an empty block the model wrote
        ("A.", {"reasoning_content": ""}, ("", "A.", False)),  # a parser's empty block
        ("A.", {}, (None, "A.", False)),  # no think block at all
        ("<think>\ncut off", {}, ("cut off", "", True)),  # the one unclosed rule
        ("text with <think> inside", {}, (None, "text with <think> inside", False)),
        # With a reasoning field the content is verbatim, literal tags included (as Qwen3's template).
        ("It ends with </think> then the answer.", {"reasoning_content": "R"},
         ("R", "It ends with </think> then the answer.", False)),
        ("Write <think> then </think>.", {"reasoning": "R"}, ("R", "Write <think> then </think>.", False)),
        ("Keep this. <think>x", {"reasoning_content": "R"}, ("R", "Keep this. <think>x", False)),
    ],
)
def test_one_reasoning_rule(content, fields, expected):
    assert final(content, **fields) == expected


def test_speaker_names_are_case_insensitive_and_documented():
    turns = [{"from": name.upper(), "value": '{"name": "f"}' if name == "function_call" else "v"} for name in SPEAKERS]
    roles = {message["role"] for message in conversation_from_row({"conversations": turns}, "t").messages}
    assert roles == {"user", "assistant", "system", "developer", "tool"}
    assert SPEAKERS["observation"] == SPEAKERS["function_response"] == "tool"
    assert SPEAKERS["function_call"] == "assistant" and SPEAKERS["bing"] == "assistant"


def test_one_id_rule():
    prompt = [{"role": "user", "content": "q"}]
    answered = prompt + [{"role": "assistant", "content": "a"}]
    assert conversation_from_row({"id": 7, "messages": answered}, "t").id == "7"
    # Without an id: a hash of the prompt, so a prompt and the rows generated from it agree.
    assert conversation_from_row({"messages": answered}, "t").id == content_hash_id(prompt)
    assert conversation_from_row({"messages": prompt}, "t").id == content_hash_id(prompt)
    with pytest.raises(InputError, match="t: 'id' must be a string or an integer, got bool"):
        conversation_from_row({"id": True, "messages": prompt}, "t")


def test_tools_and_kept_fields():
    tool = {"type": "function", "function": {"name": "f"}}
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    row = {"tools": [tool], "messages": [{"role": "user", "content": "q"},
                                         {"role": "assistant", "content": None, "tool_calls": call},
                                         {"role": "tool", "content": "r", "tool_call_id": "c1"}]}
    conversation = conversation_from_row(row, "t")
    assert conversation.tools == [tool]
    assert conversation.messages[1] == {"role": "assistant", "content": "", "tool_calls": call}
    assert conversation.prompt()[-1] == {"role": "tool", "content": "r", "tool_call_id": "c1"}


def test_separate_rejects_a_non_string_reasoning_field():
    with pytest.raises(ValueError, match="reasoning_content must be a string"):
        separate({"content": "a", "reasoning_content": 5})


def test_tools_stored_as_json_text_are_parsed():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    row = {"tools": json.dumps([tool]), "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert conversation_from_row(row, "t.jsonl:3").tools == [tool]
    assert conversation_from_row({**row, "tools": ""}, "t").tools is None
    with pytest.raises(InputError, match=r"^t.jsonl:3: 'tools' must be a list of objects, or that list as JSON text; "
                                         r"got a string that is not JSON"):
        conversation_from_row({**row, "tools": "[{"}, "t.jsonl:3")
    with pytest.raises(InputError, match=r"^t: 'tools' must be a list of objects"):
        conversation_from_row({**row, "tools": "[1, 2]"}, "t")


@pytest.mark.parametrize("value", [
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}',  # OpenAI's arguments as JSON text
    '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
    {"name": "get_weather", "arguments": {"city": "Oslo"}},
])
def test_sharegpt_function_call_turns_are_tool_calls(value):
    row = {"conversations": [{"from": "human", "value": "Weather in Oslo?"}, {"from": "function_call", "value": value},
                             {"from": "observation", "value": "rain"}, {"from": "gpt", "value": "It rains."}]}
    call = conversation_from_row(row, "t").messages[1]
    assert call == {"role": "assistant", "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}


@pytest.mark.parametrize("value, problem", [
    ("get_weather(Oslo)", "a function_call turn must hold a JSON call"),
    ('{"arguments": {}}', 'a function_call turn must hold a JSON call with a "name"'),
    ("[]", "a function_call turn holds no call"),
])
def test_a_malformed_function_call_turn_is_a_one_line_error(value, problem):
    row = {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": value}]}
    with pytest.raises(InputError, match=r"^t.jsonl:1: conversations\[1\]: ") as caught:
        conversation_from_row(row, "t.jsonl:1")
    assert problem in str(caught.value) and "\n" not in str(caught.value)
