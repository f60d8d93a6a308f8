"""Prompt datasets: conversation rows read as prompts to complete (generate, bench, evaluate).

A prompt row is a conversation row (any format `data.conversation` reads) without its final
answer: trailing assistant turns, if present, are dropped, since regenerating them is the point.
The prompt must end with a user (or tool) turn. The id follows the one id rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.data.conversation import conversation_from_row
from draftsmith.data.sources import Record, iter_records, resolve, skip_oversized


@dataclass
class PromptSample:
    """One prompt to complete: a stable id, the prompt messages and the row's tools."""

    id: str
    messages: list[dict[str, Any]]
    source: str
    """``file:line`` (or ``file: row N``) for error messages."""
    tools: list[dict[str, Any]] | None = None

    @property
    def prompt_chars(self) -> int:
        return sum(len(m.get("content") or "") for m in self.messages)

    def prefix_key(self) -> str:
        """A key whose sort order puts prompts with shared prefixes next to each other."""
        return "\x00".join(f"{m['role']}\x01{m.get('content') or ''}" for m in self.messages)


def prompt_from_row(row: Any, where: str) -> PromptSample:
    conversation = conversation_from_row(row, where)
    return PromptSample(conversation.id, conversation.prompt(), where, conversation.tools)


def parse_prompt(record: Record) -> PromptSample:
    return prompt_from_row(record.parse(), record.where)


def iter_prompts(paths: str | Path | Iterable[str | Path], split: str | None = None) -> Iterator[PromptSample]:
    """The prompt samples of the inputs, streaming; a bad row raises a one-line `InputError`."""
    for record in skip_oversized(iter_records(resolve(paths, split))):
        yield parse_prompt(record)


def load_prompts(
    paths: str | Path | Iterable[str | Path], split: str | None = None
) -> tuple[list[PromptSample], list[str]]:
    """Load every prompt; returns (unique samples, ids of the duplicate rows dropped).

    Rows sharing an id must be the same prompt (then the duplicate is dropped and counted);
    the same id with a different prompt is an ``InputError`` naming both places.
    """
    seen: dict[str, PromptSample] = {}
    duplicates: list[str] = []
    for sample in iter_prompts(paths, split):
        previous = seen.get(sample.id)
        if previous is None:
            seen[sample.id] = sample
        elif previous.messages == sample.messages:
            duplicates.append(sample.id)
        else:
            raise InputError(
                f"{sample.source}: sample id {sample.id!r} was already used by a different prompt at {previous.source}"
            )
    return list(seen.values()), duplicates


def generation_prompt_ids(tokenizer: Any, messages: list[dict], tools: list | None = None,
                          template_kwargs: dict[str, Any] | None = None) -> list[int]:  # fmt: skip
    """The ids a model continues from: `messages` (and `tools`) through the chat template with the
    generation prompt, rendered as text and encoded without special tokens (the template adds its own),
    as engines do. Used by every stage that decodes in process (eval, train --eval-prompts, the gates)."""
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
