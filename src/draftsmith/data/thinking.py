"""What a target's chat template supports for thinking, and the thinking mode a stage defaults to.

One inspection for generate, bench, tokenize and eval: a template that reads `enable_thinking` has
a switch (Qwen3: on unless switched off); one that handles `<think>` without a switch always
thinks (DeepSeek-R1 style); one with neither does not think (Llama, Gemma, Mistral, Qwen2.5), so
no reasoning is expected and `enable_thinking` is not sent; with no template known the old default
(switch on) stays. The chosen mode is a `ThinkingMode`, whose `line` the stages print on stderr.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from draftsmith.data.reasoning import THINK_OPEN

Support = Literal["switch", "always", "none", "unknown"]
_SWITCH = re.compile(r"\benable_thinking\b")


def template_text(template: Any) -> str | None:
    """A chat template as one text: a string, or the named templates of a tokenizer (their "default",
    else all of them), or None."""
    if isinstance(template, str):
        return template
    if isinstance(template, dict):
        return template.get("default") or "\n".join(str(t) for t in template.values())
    if isinstance(template, list):  # tokenizer_config.json: [{"name": ..., "template": ...}]
        named = {item.get("name"): item.get("template") for item in template if isinstance(item, dict)}
        return template_text({k: v for k, v in named.items() if isinstance(v, str)})
    return None


def read_chat_template(directory: str | Path) -> str | None:
    """The chat template of a model or tokenizer directory, read from its files (no tokenizer load):
    chat_template.jinja, chat_template.json or tokenizer_config.json's `chat_template`."""
    directory = Path(directory)
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8", errors="replace")
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = directory / name
        if path.is_file():
            try:
                found = template_text(json.loads(path.read_text(encoding="utf-8")).get("chat_template"))
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue
            if found:
                return found
    return None


def thinking_support(template: Any) -> Support:
    """"switch" (reads enable_thinking), "always" (<think> without a switch), "none" or "unknown"."""
    text = template_text(template)
    if not text:
        return "unknown"
    if _SWITCH.search(text):
        return "switch"
    return "always" if THINK_OPEN in text else "none"


@dataclass(frozen=True)
class ThinkingMode:
    """The chat_template_kwargs a stage sends or renders with, whether reasoning is expected, and why."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    expect_reasoning: bool = True
    support: Support = "unknown"
    chosen_by_default: bool = True

    @property
    def line(self) -> str:
        how = "default" if self.chosen_by_default else "as asked"
        sent = f"enable_thinking={str(self.kwargs['enable_thinking']).lower()}" if "enable_thinking" in self.kwargs \
            else "enable_thinking not sent"
        why = {
            "switch": "the chat template has a thinking switch",
            "always": "the chat template always opens <think> (no switch)",
            "none": "the chat template has no thinking (no enable_thinking, no <think>)",
            "unknown": "the target's chat template is unknown (pass --target DIR so the default follows it)",
        }[self.support]
        return f"thinking {'on' if self.expect_reasoning else 'off'} ({how}; {sent}): {why}"


def choose_thinking(template: Any, kwargs: dict[str, Any] | None = None, thinking: bool | None = None,
                    send_default: bool = True) -> ThinkingMode:
    """The thinking mode of a run: `thinking` (--thinking/--no-thinking) or an enable_thinking in
    `kwargs` when given, else what the template supports. A template without a switch ignores
    enable_thinking, so it is not sent (and a resume is not told apart by it). Without
    `send_default` (tokenize, eval: they render the template themselves) a switch is left at the
    template's own default rather than set on."""
    support = thinking_support(template)
    kwargs = dict(kwargs or {})
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    asked = kwargs.get("enable_thinking")
    if support in ("none", "always"):
        kwargs.pop("enable_thinking", None)
        return ThinkingMode(kwargs, support == "always", support, asked is None)
    if asked is None and send_default:
        kwargs = {"enable_thinking": True, **kwargs}
    return ThinkingMode(kwargs, kwargs.get("enable_thinking") is not False, support, asked is None)
