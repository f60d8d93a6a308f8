"""Reasoning / answer separation for every field convention engines and datasets use.

* SGLang and llama-server (``--reasoning-format deepseek``), SpecForge data: ``reasoning_content``;
* vLLM (``--reasoning-parser``): ``message.reasoning`` (older vLLM: ``reasoning_content``);
* an engine without a reasoning parser, ShareGPT exports: ``<think>…</think>`` inline in ``content``.

One splitter (`split_think`) serves every reader, with one rule for an unclosed block: a
``<think>`` opening the text and never closed is a generation cut off mid-reasoning, so all of it
is reasoning and the answer is empty. A ``<think>`` anywhere else without a close is plain text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
REASONING_KEYS = ("reasoning_content", "reasoning")


@dataclass(frozen=True)
class Separated:
    """A message's reasoning and answer, untouched whitespace included."""

    reasoning: str | None
    """None when the message carries no reasoning at all (neither field nor tags)."""
    content: str
    source: str
    """``"reasoning_content"``, ``"reasoning"``, ``"inline"`` or ``"none"``."""
    unclosed: bool = False
    """The reasoning was cut off: an opening ``<think>`` never closed."""


def split_think(text: str) -> tuple[str, str]:
    """Split raw generated text into ``(reasoning, content)`` like the qwen3 reasoning parsers.

    Text up to ``</think>`` (minus a leading ``<think>``) is reasoning; a generation cut off
    inside an open ``<think>`` is all reasoning; text without think tags is all content.
    Whitespace is returned untouched.
    """
    reasoning, content, _ = _split(text)
    return reasoning or "", content


def _split(text: str) -> tuple[str | None, str, bool]:
    if THINK_CLOSE in text:
        reasoning, content = text.split(THINK_CLOSE, 1)
        if THINK_OPEN in reasoning:
            reasoning = reasoning.split(THINK_OPEN, 1)[1]
        return reasoning, content, False
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        return stripped[len(THINK_OPEN):], "", True
    return None, text, False


def text_of(content: Any) -> str:
    """Message content as text: a string, null, or OpenAI text parts (other parts: ValueError)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in (None, "text") and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise ValueError(f"content part {part!r:.60} is not text; only text conversations are supported")
        return "".join(texts)
    raise ValueError(f"content must be a string, got {type(content).__name__}")


def separate(message: dict[str, Any], content: str | None = None) -> Separated:
    """The one rule: a non-empty reasoning field wins and the content stays verbatim, literal
    ``<think>``/``</think>`` included (as Qwen3's template keeps it when ``reasoning_content`` is
    given: it is text the model wrote after its think block); otherwise inline tags; otherwise an
    empty field still says "reasoning, empty". `content`: the message's text when the caller
    already has it."""
    if content is None:
        content = text_of(message.get("content"))
    empty_field = None
    for key in REASONING_KEYS:
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {type(value).__name__}")
        if not value.strip():
            empty_field = empty_field or key
            continue
        return Separated(value, content, key)
    reasoning, answer, unclosed = _split(content)
    if reasoning is not None:
        return Separated(reasoning, answer, "inline", unclosed)
    if empty_field is not None:
        return Separated("", content, empty_field)
    return Separated(None, content, "none")


def extract_reasoning(message: dict[str, Any]) -> tuple[str, str, str]:
    """Return ``(reasoning, answer, source)`` from an OpenAI chat ``message`` (or accumulated delta).

    Both parts are stripped of surrounding whitespace, so rows from different engines compare
    equal (the exact engine output is kept in the token ids).
    """
    try:
        parts = separate(message)
    except ValueError:  # an engine response is not input data: keep whatever text it has
        parts = separate({"content": str(message.get("content") or "")})
    source = "none" if parts.source != "inline" and not (parts.reasoning or "").strip() else parts.source
    return (parts.reasoning or "").strip(), parts.content.strip(), source
