"""Reasoning / answer separation for every field convention engines use.

* SGLang and llama-server (``--reasoning-format deepseek``): ``message.reasoning_content``;
* vLLM (``--reasoning-parser``): ``message.reasoning`` (older vLLM: ``reasoning_content``);
* an engine without a reasoning parser: ``<think>…</think>`` inline at the start of ``content``.
"""

from __future__ import annotations

from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
REASONING_KEYS = ("reasoning_content", "reasoning")


def split_think(text: str) -> tuple[str, str]:
    """Split raw generated text into ``(reasoning, content)`` like the qwen3 reasoning parsers.

    Text up to ``</think>`` (minus a leading ``<think>``) is reasoning; a generation cut off
    inside an open ``<think>`` is all reasoning; text without think tags is all content.
    Whitespace is returned untouched.
    """
    if THINK_CLOSE in text:
        reasoning, content = text.split(THINK_CLOSE, 1)
        if THINK_OPEN in reasoning:
            reasoning = reasoning.split(THINK_OPEN, 1)[1]
        return reasoning, content
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return stripped[len(THINK_OPEN):], ""
    return "", text


def extract_reasoning(message: dict[str, Any]) -> tuple[str, str, str]:
    """Return ``(reasoning, answer, source)`` from an OpenAI chat ``message`` (or accumulated delta).

    ``source`` names where the reasoning came from: ``"reasoning_content"``, ``"reasoning"``,
    ``"inline"`` or ``"none"``. Both parts are stripped of surrounding whitespace, so rows from
    different engines compare equal (the exact engine output is kept in the token ids).
    """
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    for key in REASONING_KEYS:
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            # A parser can still leave a stray closing tag in content; never keep it in the answer.
            if THINK_CLOSE in content:
                extra, content = split_think(content)
                value = value + extra
            return value.strip(), content.strip(), key
    if THINK_OPEN in content or THINK_CLOSE in content:
        reasoning, answer = split_think(content)
        return reasoning.strip(), answer.strip(), "inline"
    return "", content.strip(), "none"
