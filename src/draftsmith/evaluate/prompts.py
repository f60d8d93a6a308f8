"""Evaluation prompts: conversation rows read by `draftsmith.data` (the prompt before the final
answer), or raw-text rows with a `prompt` or `text` field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.data.conversation import content_hash_id
from draftsmith.data.prompts import prompt_from_row as conversation_prompt
from draftsmith.data.sources import iter_records, resolve, skip_oversized


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    tools: list[dict[str, Any]] | None = None


def prompt_from_row(row: Any, where: str) -> Prompt:
    """One prompt row (`messages`, `conversations`, or `prompt`/`text`) as a `Prompt`; any other
    row gets the error every conversation reader gives."""
    if isinstance(row, dict) and row.get("messages") is None and row.get("conversations") is None:
        for key in ("prompt", "text"):
            if isinstance(row.get(key), str):
                raw_id = row.get("id")
                row_id = str(raw_id) if raw_id not in (None, "") else content_hash_id([{"role": "user", "content": row[key]}])
                return Prompt(row_id, text=row[key])
    sample = conversation_prompt(row, where)
    return Prompt(sample.id, messages=sample.messages, tools=sample.tools)


def read_prompts(path: str | Path, limit: int | None = None, split: str | None = None) -> list[Prompt]:
    """Prompts from any source `draftsmith.data` reads, at most `limit` of them."""
    prompts: list[Prompt] = []
    for record in skip_oversized(iter_records(resolve(path, split))):
        prompts.append(prompt_from_row(record.parse(), record.where))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise InputError(f"{path}: no prompts")
    return prompts
