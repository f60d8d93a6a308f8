"""Read evaluation prompts: conversation rows (OpenAI `messages` or ShareGPT `conversations`) or raw text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.core.lines import iter_lines

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, Any]] | None = None
    text: str | None = None


def _rows(path: Path):
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        for index, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield index, row
        return
    if suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: invalid JSON: {error}") from error
        if not isinstance(data, list):
            raise InputError(f"{path}: expected a JSON list of prompt rows")
        yield from enumerate(data, start=1)
        return
    for line_number, line in iter_lines(path):
        try:
            yield line_number, json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{line_number}: invalid JSON: {error.msg}") from error


def _prompt_messages(messages: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    if not messages:
        raise InputError(f"{where}: `messages` is empty")
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise InputError(f"{where}: every message needs a `role`")
    # A row that still carries the reference answer is evaluated on its prompt only.
    while messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages:
        raise InputError(f"{where}: no prompt left after removing the assistant answer")
    return messages


def prompt_from_row(row: dict[str, Any], where: str, default_id: str) -> Prompt:
    """One prompt row (`messages`, ShareGPT `conversations`, or `prompt`/`text`) as a `Prompt`."""
    row_id = str(row.get("id", default_id))
    for key in ("messages", "conversations"):
        value = row.get(key)
        if hasattr(value, "tolist"):  # a Parquet list column
            value = row[key] = value.tolist()
        if value is not None and not (isinstance(value, list) and all(isinstance(turn, dict) for turn in value)):
            raise InputError(f"{where}: `{key}` must be a list of message objects, got {type(value).__name__} {value!r:.40}")
    if row.get("messages") is not None:
        return Prompt(row_id, messages=_prompt_messages(list(row["messages"]), where))
    if row.get("conversations") is not None:
        messages = []
        for turn in row["conversations"]:
            role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
            if role is None:
                raise InputError(f"{where}: unknown ShareGPT role {turn.get('from')!r}")
            messages.append({"role": role, "content": turn.get("value", "")})
        return Prompt(row_id, messages=_prompt_messages(messages, where))
    for key in ("prompt", "text"):
        if isinstance(row.get(key), str):
            return Prompt(row_id, text=row[key])
    raise InputError(f"{where}: a prompt row needs `messages`, `conversations` or `prompt`")


def read_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Prompts from JSONL / JSON / Parquet rows with `messages`, `conversations` or `prompt`/`text`."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: prompts file not found")
    prompts: list[Prompt] = []
    for number, row in _rows(path):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise InputError(f"{where}: expected an object, got {type(row).__name__}")
        prompts.append(prompt_from_row(row, where, default_id=str(number)))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise InputError(f"{path}: no prompts")
    return prompts
