"""One Conversation model for every row format draftsmith reads.

A row holds OpenAI ``messages``, or ``conversations`` in ShareGPT form (``from``/``value``) or in
role/content form (SpecForge's regenerated data: ``role``/``content``/``reasoning_content``).
Speaker and role names go through one case-insensitive map, `SPEAKERS`:

======================================================  =============
human, user                                             user
gpt, assistant, model, chatgpt, bing, bard, claude,     assistant
function_call (a call the model made)
system                                                  system
developer                                               developer
tool, function, observation, function_response,         tool
tool_response, ipython
======================================================  =============

Each assistant turn's reasoning comes from ``reasoning_content``, ``reasoning`` or inline
``<think>`` through `data.reasoning.separate` and is kept as ``reasoning_content`` (absent when the
turn has none). A ShareGPT ``function_call`` turn (the call as JSON text) becomes an assistant turn
with ``tool_calls``. A row-level ``tools`` list is kept, also when stored as JSON text. The id is the row's ``id`` (a string or an
integer) or else `content_hash_id` of the prompt: the messages before the final assistant turn,
so a prompt and the rows generated from it share an id.

A malformed row raises `InputError` with one line: ``<file:line or file: row N>: <problem>``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.data.reasoning import separate, text_of
from draftsmith.data.sources import Record

SPEAKERS = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "claude": "assistant",
    "function_call": "assistant",
    "system": "system",
    "developer": "developer",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_response": "tool",
    "tool_response": "tool",
    "ipython": "tool",
}
#: message fields kept besides role and content (reasoning is re-derived, never copied)
KEPT_FIELDS = ("tool_calls", "tool_call_id", "name")


def content_hash_id(messages: list[dict[str, Any]]) -> str:
    """A stable id for a row without one: sha256 of the canonical JSON of (role, content) pairs."""
    canonical = json.dumps(
        [[m.get("role"), m.get("content")] for m in messages], ensure_ascii=False, separators=(",", ":")
    )
    # surrogatepass: the same bytes for every valid string, and no crash on a lone surrogate
    return "h" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:24]


@dataclass
class Conversation:
    """A checked row: id, OpenAI-style messages, tools, and the row's other fields."""

    id: str
    messages: list[dict[str, Any]]
    where: str
    tools: list[dict[str, Any]] | None = None
    unclosed_think: bool = False
    """The final assistant turn's reasoning was cut off inside an open ``<think>``."""
    fields: dict[str, Any] = field(default_factory=dict)
    """Everything else the row carried (finish_reason, usage, engine token ids, ...)."""

    def answer_index(self) -> int | None:
        """Index of the final assistant message, None without one."""
        return next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i]["role"] == "assistant"), None)

    def require_answer(self) -> dict[str, Any]:
        """The final assistant message, or the one-line error every completion reader gives."""
        index = self.answer_index()
        if index is None:
            raise InputError(f"{self.where}: row {self.id!r} has no assistant turn")
        return self.messages[index]

    def prompt(self) -> list[dict[str, Any]]:
        """The prompt to complete: the messages before trailing assistant turns, without reasoning."""
        end = len(self.messages)
        while end and self.messages[end - 1]["role"] == "assistant":
            end -= 1
        if end == 0:
            raise InputError(f"{self.where}: row {self.id!r} has no prompt before the assistant turn")
        prompt = [
            {key: value for key, value in message.items() if key != "reasoning_content"}
            for message in self.messages[:end]
        ]
        if prompt[-1]["role"] not in ("user", "tool"):
            raise InputError(
                f"{self.where}: row {self.id!r}: the prompt must end with a user (or tool) turn, "
                f"ends with {prompt[-1]['role']!r}"
            )
        return prompt


def _message(turn: Any, where: str, key: str, index: int) -> tuple[dict[str, Any], bool]:
    if not isinstance(turn, dict):
        raise InputError(f"{where}: {key}[{index}] must be an object, got {type(turn).__name__}")
    # Columnar sources give every turn every key (null where a row lacked it): test values, not keys.
    sharegpt = turn.get("from") is not None
    speaker = turn.get("from") if sharegpt else turn.get("role")
    role = SPEAKERS.get(speaker.lower()) if isinstance(speaker, str) else None
    if role is None:
        raise InputError(
            f"{where}: {key}[{index}]: unknown speaker {speaker!r} (expected one of {', '.join(sorted(SPEAKERS))})"
        )
    content = turn.get("value") if sharegpt else turn.get("content")
    if sharegpt and speaker.lower() == "function_call":
        return _function_call_message(content, where, f"{key}[{index}]"), False
    try:
        message: dict[str, Any] = {"role": role, "content": text_of(content)}
        if role == "assistant":
            parts = separate(turn, message["content"])
            message["content"] = parts.content
            if parts.source == "inline":
                # Split as Qwen3-style templates split inline tags themselves.
                message["content"] = parts.content.lstrip("\n")
                message["reasoning_content"] = (parts.reasoning or "").strip("\n")
            elif parts.reasoning is not None:
                message["reasoning_content"] = parts.reasoning
            unclosed = parts.unclosed
        else:
            unclosed = False
    except ValueError as error:
        raise InputError(f"{where}: {key}[{index}]: {error}") from None
    for name in KEPT_FIELDS:
        if turn.get(name) is not None:
            message[name] = turn[name]
    return message, unclosed


def _function_call_message(value: Any, where: str, at: str) -> dict[str, Any]:
    """A ShareGPT ``function_call`` turn (the call the model made, as JSON text: one call
    ``{"name", "arguments"}`` or a list of them) as an assistant message with ``tool_calls``."""
    calls = value
    if isinstance(value, str):
        try:
            calls = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            raise InputError(f"{where}: {at}: a function_call turn must hold a JSON call {{\"name\", \"arguments\"}}, "
                             f"got {value[:60]!r}") from None
    if isinstance(calls, dict):
        calls = [calls]
    tool_calls = []
    for call in calls if isinstance(calls, list) else [None]:
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            call = call["function"]  # already OpenAI-shaped
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"]):
            raise InputError(f"{where}: {at}: a function_call turn must hold a JSON call with a \"name\"")
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI's form: the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                pass  # kept as the model wrote it
        tool_calls.append({"type": "function", "function": {"name": call["name"], "arguments": arguments}})
    if not tool_calls:
        raise InputError(f"{where}: {at}: a function_call turn holds no call")
    return {"role": "assistant", "content": "", "tool_calls": tool_calls}


def _tools(value: Any, where: str) -> list[dict[str, Any]] | None:
    """A row's ``tools``: a list of objects, or that list as JSON text (common in function-calling
    datasets); empty means none."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError) as error:
            message = getattr(error, "msg", "nested too deeply")
            raise InputError(
                f"{where}: 'tools' must be a list of objects, or that list as JSON text; got a string "
                f"that is not JSON ({message})"
            ) from None
        if isinstance(value, dict):
            value = [value]
    if value is None:
        return None
    if not (isinstance(value, list) and all(isinstance(tool, dict) for tool in value)):
        raise InputError(f"{where}: 'tools' must be a list of objects (or that list as JSON text)")
    return value or None


def conversation_from_row(row: Any, where: str) -> Conversation:
    """Check and normalize one decoded row (see the module docstring)."""
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if row.get("messages") is not None:
        key = "messages"
    elif row.get("conversations") is not None:
        key = "conversations"
    else:
        raise InputError(f"{where}: row has neither 'messages' nor 'conversations'")
    turns = row[key]
    if hasattr(turns, "tolist"):  # a numpy array from a columnar reader
        turns = turns.tolist()
    if not isinstance(turns, list):
        raise InputError(f"{where}: '{key}' must be a list, got {type(turns).__name__}")
    if not turns:
        raise InputError(f"{where}: '{key}' is empty")
    messages: list[dict[str, Any]] = []
    unclosed = False
    for index, turn in enumerate(turns):
        message, unclosed = _message(turn, where, key, index)
        messages.append(message)
    tools = _tools(row.get("tools"), where)
    raw_id = row.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int, type(None))):
        raise InputError(f"{where}: 'id' must be a string or an integer, got {type(raw_id).__name__}")
    if raw_id is None or raw_id == "":
        end = len(messages)
        while end > 1 and messages[end - 1]["role"] == "assistant":
            end -= 1
        row_id = content_hash_id(messages[:end])
    else:
        row_id = str(raw_id)
    extra = {name: value for name, value in row.items() if name not in ("id", "messages", "conversations", "tools")}
    return Conversation(row_id, messages, where, tools, unclosed and messages[-1]["role"] == "assistant", extra)


def parse_conversation(record: Record) -> Conversation:
    """A `Record` from `data.sources` as a checked Conversation (or a one-line `InputError`)."""
    return conversation_from_row(record.parse(), record.where)
