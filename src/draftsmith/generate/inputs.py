"""Reading prompt datasets: JSONL / JSON / Parquet files, ``datasets.save_to_disk`` directories.

A prompt row is contract 1 without the final assistant turn: ``{"id"?, "messages": [...]}`` or
ShareGPT ``{"id"?, "conversations": [{"from": "human"|"gpt"|"system", "value"}]}``. A final
assistant turn, if present, is dropped: regenerating it is the point. The sample id is the row's
``id`` (stringified) or, without one, a hash of the prompt messages, so it is stable across runs,
machines and input orderings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.core.lines import iter_lines

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool", "function_call": "assistant", "observation": "tool"}
ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass
class PromptSample:
    """One prompt to complete: a stable id and the prompt messages (without the final answer)."""

    id: str
    messages: list[dict[str, Any]]
    source: str
    """``file:line`` (or ``file:row N``) for error messages."""

    @property
    def prompt_chars(self) -> int:
        return sum(len(m.get("content") or "") for m in self.messages)

    def prefix_key(self) -> str:
        """A key whose sort order puts prompts with shared prefixes next to each other."""
        return "\x00".join(f"{m['role']}\x01{m.get('content') or ''}" for m in self.messages)


def content_hash_id(messages: list[dict[str, Any]]) -> str:
    """A stable id for a row without one: sha256 of the canonical JSON of (role, content) pairs."""
    canonical = json.dumps([[m.get("role"), m.get("content")] for m in messages], ensure_ascii=False,
                           separators=(",", ":"))
    return "h" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


def _normalize_messages(row: dict[str, Any], where: str) -> list[dict[str, Any]]:
    if "messages" in row and row["messages"] is not None:
        raw = row["messages"]
        sharegpt = False
    elif "conversations" in row and row["conversations"] is not None:
        raw = row["conversations"]
        sharegpt = True
    else:
        raise InputError(f"{where}: row has neither 'messages' nor 'conversations'")
    if hasattr(raw, "tolist"):
        raw = raw.tolist()
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: 'messages' must be a non-empty list")
    messages = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InputError(f"{where}: message {index} is not an object")
        if sharegpt:
            role = SHAREGPT_ROLES.get(str(item.get("from")))
            content = item.get("value")
            if role is None:
                raise InputError(f"{where}: message {index} has unknown ShareGPT 'from' {item.get('from')!r}")
        else:
            role = item.get("role")
            content = item.get("content")
            if role not in ROLES:
                raise InputError(f"{where}: message {index} has unknown role {role!r}")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise InputError(f"{where}: message {index} content must be a string, got {type(content).__name__}")
        messages.append({"role": role, "content": content})
    if messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages:
        raise InputError(f"{where}: no prompt left after removing the final assistant turn")
    if messages[-1]["role"] not in ("user", "tool"):
        raise InputError(f"{where}: the prompt must end with a user (or tool) turn, ends with {messages[-1]['role']!r}")
    return messages


def sample_from_row(row: dict[str, Any], where: str) -> PromptSample:
    if not isinstance(row, dict):
        raise InputError(f"{where}: row is not a JSON object")
    messages = _normalize_messages(row, where)
    raw_id = row.get("id")
    sample_id = str(raw_id) if raw_id is not None and str(raw_id) != "" else content_hash_id(messages)
    return PromptSample(sample_id, messages, where)


def _iter_jsonl(path: Path) -> Iterator[PromptSample]:
    for number, line in iter_lines(path):
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{where}: invalid JSON ({error.msg} at column {error.colno})") from None
        yield sample_from_row(row, where)


def _iter_rows(rows: Any, label: str) -> Iterator[PromptSample]:
    for number, row in enumerate(rows):
        yield sample_from_row(row, f"{label}: row {number}")


def iter_prompts(path: str | Path) -> Iterator[PromptSample]:
    """Yield the prompt samples of one input (file or directory), raising ``InputError`` on bad rows."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            import datasets

            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                split = "train" if "train" in loaded else next(iter(loaded))
                loaded = loaded[split]
            yield from _iter_rows(loaded, str(path))
            return
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet", ".json"))
        if not files:
            raise InputError(f"{path}: directory has no .jsonl/.json/.parquet files and is not a saved dataset")
        for file in files:
            yield from iter_prompts(file)
        return
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _iter_jsonl(path)
    elif suffix == ".json":
        with path.open("r", encoding="utf-8") as handle:
            head = handle.read(1)
            while head and head.isspace():
                head = handle.read(1)
        if head == "[":
            try:
                rows = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as error:
                raise InputError(f"{path}: invalid JSON ({error.msg} at line {error.lineno})") from None
            yield from _iter_rows(rows, str(path))
        else:
            yield from _iter_jsonl(path)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        yield from _iter_rows(table.to_pylist(), str(path))
    else:
        raise InputError(f"{path}: unsupported input format {suffix!r} (use .jsonl, .json, .parquet or a dataset dir)")


def load_prompts(paths: list[str | Path] | str | Path) -> tuple[list[PromptSample], list[str]]:
    """Load every prompt; returns (unique samples, ids of the duplicate rows dropped).

    Rows sharing an id must be the same prompt (then the duplicate is dropped and counted);
    the same id with a different prompt is an ``InputError`` naming both places.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    seen: dict[str, PromptSample] = {}
    duplicates: list[str] = []
    for path in paths:
        for sample in iter_prompts(path):
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


def shard_of(sample_id: str, shard_count: int) -> int:
    """Which of ``shard_count`` shards a sample belongs to: a stable hash of its id, so shards are
    disjoint and complete whatever the input order or the machine."""
    if shard_count <= 1:
        return 0
    digest = hashlib.blake2b(sample_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count
