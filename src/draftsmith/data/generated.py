"""Data contract 1, generated rows: one streaming reader and one append-only, line-atomic writer.

A generated row is one JSON line, ``id`` first::

    {"id", "messages": [...prompt, {"role": "assistant", "content", "reasoning_content"}],
     "tools"?, "finish_reason", "prompt_tokens", "completion_tokens", "reasoning_tokens",
     "prompt_token_ids", "completion_token_ids", "model", "endpoint", "latency_s"}

A row is written whole, with one ``write`` of a complete line, so a reader sees complete rows and
at most a torn last line from a crash (which `draftsmith.generate`'s store cuts off on resume).
Rows are read like every conversation row (`data.sources.iter_records` then
`data.conversation.parse_conversation`, streaming); `engine_fields` checks the engine fields.

The one row-completeness rule, `incomplete_answer`: a row's final assistant turn is a complete
answer only when

* the engine said how it finished: a row that carries ``finish_reason`` (every engine row does)
  must have a string there ("stop", "length", "tool_calls", ...), not null (a stream cut off before
  its last chunk and ``[DONE]``) and not an abort; rows without engine fields (a plain dataset) are
  not held to this;
* its content is text (a string or OpenAI text parts); null is an answer only in a turn that makes
  tool calls or carries reasoning (an engine's reasoning parser leaves content null when the model
  wrote nothing after, or was cut off inside, its thinking); a number, boolean or object never is.

`generate` never writes a row that breaks it (it retries the sample); `tokenize` drops such rows,
counted as `INCOMPLETE_ANSWER`, instead of training them (and the end-of-turn token after them).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, TextIO

from draftsmith.core.errors import InputError
from draftsmith.data.conversation import Conversation

#: The drop reason of a row `incomplete_answer` refuses.
INCOMPLETE_ANSWER = "incomplete_answer"
#: finish_reason values that say the engine gave up on the request, not that the answer ended.
UNFINISHED_REASONS = frozenset({"abort", "aborted", "cancelled", "canceled", "error"})
_ASSISTANT_SPEAKERS = frozenset({"assistant", "gpt", "model", "chatgpt", "bing", "bard", "claude", "function_call"})

_ID_PREFIX = re.compile(r'\{"id": ("(?:[^"\\]|\\.)*"),')


def generated_row(
    sample_id: str,
    prompt: list[dict[str, Any]],
    content: str,
    reasoning: str | None,
    tools: list[dict[str, Any]] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A contract-1 row: the prompt plus the generated assistant turn (with the tool calls it
    made, if any), then engine fields."""
    answer: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        answer["tool_calls"] = tool_calls
    row: dict[str, Any] = {"id": sample_id, "messages": [*prompt, answer]}
    if tools:
        row["tools"] = tools
    row.update(fields)
    return row


def encode_row(row: dict[str, Any]) -> str:
    """One row as one JSON line, ``id`` first (so `line_id` can read it without a full parse)."""
    return json.dumps({"id": row["id"], **row}, ensure_ascii=False) + "\n"


def line_id(line: str) -> str | None:
    """The id of an encoded row line, read from its prefix; None if the line is not one."""
    fast = _ID_PREFIX.match(line)
    if fast is not None and line.rstrip().endswith("}"):
        return json.loads(fast.group(1))
    try:
        row = json.loads(line)
        return str(row["id"])
    except (json.JSONDecodeError, KeyError, TypeError):
        return None


class RowWriter:
    """Appends encoded rows to a new file; `flush` hands them to the OS, `sync` to the disk."""

    def __init__(self, path: Path):
        self.path = path
        # "x": never reuse a file another process might be writing.
        self._handle: TextIO | None = path.open("x", encoding="utf-8")

    def write(self, row: dict[str, Any], flush: bool = True) -> None:
        assert self._handle is not None
        self._handle.write(encode_row(row))
        if flush:
            self._handle.flush()

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.flush()

    def sync(self) -> None:
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is None:
            return
        self.sync()
        self._handle.close()
        self._handle = None
        # An empty file (a run that wrote nothing) is noise for readers.
        if self.path.exists() and self.path.stat().st_size == 0:
            self.path.unlink()


def engine_fields(conversation: Conversation) -> dict[str, Any]:
    """The checked contract-1 engine fields of a row: finish reason, engine token ids and the usage
    counts of those ids (None where absent or not an integer)."""
    fields = conversation.fields
    finish_reason = fields.get("finish_reason")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise InputError(f"{conversation.where}: row {conversation.id!r}: finish_reason must be a string or null")
    checked: dict[str, Any] = {"finish_reason": finish_reason}
    for key in ("prompt_token_ids", "completion_token_ids"):
        value = fields.get(key)
        if hasattr(value, "tolist"):
            value = value.tolist()
        if value is not None and not (
            isinstance(value, list) and all(isinstance(item, int) and not isinstance(item, bool) for item in value)
        ):
            raise InputError(f"{conversation.where}: row {conversation.id!r}: {key} must be a list of integers")
        checked[key] = value
    for key in ("prompt_tokens", "completion_tokens"):  # the engine's usage counts, to check the ids against
        value = fields.get(key)
        checked[key] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return checked


def _final_turn(row: dict[str, Any]) -> dict[str, Any] | None:
    turns = row.get("messages")
    if turns is None:
        turns = row.get("conversations")
    if hasattr(turns, "tolist"):  # a numpy array from a columnar reader
        turns = turns.tolist()
    if not isinstance(turns, list) or not turns or not isinstance(turns[-1], dict):
        return None
    return turns[-1]


def _is_text(content: Any) -> bool:
    if isinstance(content, str):
        return True
    if hasattr(content, "tolist"):
        content = content.tolist()
    return isinstance(content, list) and all(
        isinstance(part, str) or (isinstance(part, dict) and isinstance(part.get("text"), str)) for part in content
    )


def incomplete_answer(row: Any) -> str | None:
    """Why the final assistant turn of a decoded row is not a complete answer, or None when it is.

    The one row-completeness rule (see the module docstring). A row with no final assistant turn,
    or one that is not a row at all, gives None: that is for the row parser to report.
    """
    if not isinstance(row, dict):
        return None
    turn = _final_turn(row)
    if turn is None:
        return None
    sharegpt = turn.get("from") is not None
    speaker = turn.get("from") if sharegpt else turn.get("role")
    if not isinstance(speaker, str) or speaker.lower() not in _ASSISTANT_SPEAKERS:
        return None
    if "finish_reason" in row:
        finish_reason = row["finish_reason"]
        if finish_reason is None:
            return "finish_reason is null: the engine never said how the answer ended (a cut-off stream?)"
        if not isinstance(finish_reason, str) or not finish_reason:
            return f"finish_reason {finish_reason!r} is not an engine's finish reason"
        if finish_reason.lower() in UNFINISHED_REASONS:
            return f"finish_reason {finish_reason!r}: the engine gave up on the request"
    content = turn.get("value") if sharegpt else turn.get("content")
    if content is None:
        calls = turn.get("tool_calls")
        if hasattr(calls, "tolist"):
            calls = calls.tolist()
        if isinstance(calls, list) and calls:
            return None  # a turn that only calls tools
        if any(isinstance(turn.get(key), str) and turn[key].strip() for key in ("reasoning_content", "reasoning")):
            return None  # a reasoning parser's turn with no answer text after (or cut inside) the thinking
        return "the answer's content is null (no text, no tool calls, no reasoning)"
    if not _is_text(content):
        return f"the answer's content is a {type(content).__name__}, not text"
    return None
