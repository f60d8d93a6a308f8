"""Chat-template variants of the tiny target shared by tests of several stages."""

from __future__ import annotations

from draftsmith.tiny import chat_template

_END_OF_ASSISTANT_TURN = '''        {{- "<|im_end|>\\n" -}}
    {%- elif message.role == "tool" -%}'''
_TOOL_CALLS_THEN_END = '''        {%- for call in message.tool_calls or [] -%}
            {{- "\\n<tool_call>\\n" + (call.function | tojson) + "\\n</tool_call>" -}}
        {%- endfor -%}
        {{- "<|im_end|>\\n" -}}
    {%- elif message.role == "tool" -%}'''


def tool_call_template() -> str:
    """The tiny template plus Qwen-style `<tool_call>` blocks after the assistant content."""
    template = chat_template()
    assert _END_OF_ASSISTANT_TURN in template, "the tiny template changed; update the tool-call variant"
    return template.replace(_END_OF_ASSISTANT_TURN, _TOOL_CALLS_THEN_END)
