"""Helpers for tokenize tests: template variants of the tiny target and small file writers."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.tiny import chat_template

# The tiny Qwen3-style template with `{% generation %}` markers around everything after the
# assistant header. The markers deliberately also cover the template-inserted empty think block
# and every earlier assistant turn: tokenize must still mask those 0.
_PLAIN_TURN = '''        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}
            {{- "<|im_start|>assistant\\n<think>\\n" + reasoning.strip("\\n") + "\\n</think>\\n\\n" + content.lstrip("\\n") -}}
        {%- else -%}
            {{- "<|im_start|>assistant\\n" + content.lstrip("\\n") -}}
        {%- endif -%}
        {{- "<|im_end|>\\n" -}}'''
_MARKED_TURN = '''        {{- "<|im_start|>assistant\\n" -}}
        {%- generation -%}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}
            {{- "<think>\\n" + reasoning.strip("\\n") + "\\n</think>\\n\\n" + content.lstrip("\\n") -}}
        {%- else -%}
            {{- content.lstrip("\\n") -}}
        {%- endif -%}
        {{- "<|im_end|>" -}}
        {%- endgeneration -%}
        {{- "\\n" -}}'''

# Plain ChatML without any reasoning handling and without generation markers.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def generation_marker_template() -> str:
    template = chat_template()
    assert _PLAIN_TURN in template, "the tiny template changed; update the marker variant"
    return template.replace(_PLAIN_TURN, _MARKED_TURN)


def tokenizer_with_template(tiny_target_dir: Path, template: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    tokenizer.chat_template = template
    return tokenizer


def save_tokenizer_with_template(tiny_target_dir: Path, template: str, out: Path) -> Path:
    tokenizer_with_template(tiny_target_dir, template).save_pretrained(out)
    return out


def write_jsonl(path: Path, rows: list) -> Path:
    with path.open("w") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path

