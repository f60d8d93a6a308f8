"""Stream conversation rows (data contract 1) from JSONL, Parquet, Arrow or `datasets` dirs.

Reading is split in two so parsing can run in the worker processes: `iter_records` yields cheap
`RawRecord`s (a raw JSONL line or an already decoded Parquet/Arrow row, plus where it came from),
and `normalize_row` turns one into a checked conversation, raising `InputError` that names the
file and line (or row) when the row is malformed.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.core.lines import OversizedLine, iter_lines
from draftsmith.generate.store import generated_row_files

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.gz", ".ndjson.gz", ".json.gz")
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)

# ShareGPT speaker names seen in the wild, mapped to OpenAI roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_response": "tool",
}
ROLES = {"system", "developer", "user", "assistant", "tool"}
BATCH_ROWS = 1024


@dataclass(frozen=True)
class RawRecord:
    """One input row before parsing: `line` is raw JSONL text, `row` a decoded table row."""

    where: str
    line: str | None = None
    row: dict[str, Any] | None = None
    oversized: int | None = None  # bytes of a line over the row-size limit (never read whole)


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suffix in JSONL_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return path.suffix.lower()


def _is_datasets_dir(path: Path) -> bool:
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files (or `datasets` dirs) to read, in a stable order; a plain dir contributes its data files."""
    paths: list[Path] = []
    for item in inputs:
        path = Path(item)
        if not path.exists():
            raise InputError(f"{path}: input does not exist")
        if path.is_dir() and not _is_datasets_dir(path):
            generated = generated_row_files(path)
            if generated:
                paths.extend(generated)
                continue
            found = sorted(
                child
                for child in path.iterdir()
                if child.is_file()
                and not child.name.startswith((".", "_"))
                and _suffix(child) in JSONL_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES
            )
            if not found:
                raise InputError(f"{path}: directory holds no .jsonl, .parquet or .arrow files")
            paths.extend(found)
        else:
            if path.is_file() and _suffix(path) not in JSONL_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES:
                raise InputError(
                    f"{path}: unknown input format (expected .jsonl, .parquet, .arrow or a datasets dir)"
                )
            paths.append(path)
    if not paths:
        raise InputError("no input files given")
    return paths


def _open_text(path: Path):
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _iter_jsonl(path: Path, max_row_bytes: int | None = None) -> Iterator[RawRecord]:
    for number, line in iter_lines(path, max_row_bytes):
        if isinstance(line, OversizedLine):
            yield RawRecord(where=f"{path}:{number}", oversized=line.size)
        else:
            yield RawRecord(where=f"{path}:{number}", line=line)


def _iter_table_batches(batches: Iterable[Any], label: str) -> Iterator[RawRecord]:
    index = 0
    for batch in batches:
        for row in batch.to_pylist():
            yield RawRecord(where=f"{label} row {index}", row=row)
            index += 1


def _iter_parquet(path: Path) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a corrupt file
        raise InputError(f"{path}: cannot read as Parquet: {error}") from error
    yield from _iter_table_batches(parquet.iter_batches(batch_size=BATCH_ROWS), str(path))


def _open_arrow(path: Path):
    import pyarrow as pa

    # `datasets` writes the IPC stream format; other tools write the file format.
    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        source = pa.memory_map(str(path))
        reader = pa.ipc.open_file(source)
        return (reader.get_batch(i) for i in range(reader.num_record_batches))


def _iter_arrow(path: Path) -> Iterator[RawRecord]:
    try:
        batches = _open_arrow(path)
    except Exception as error:
        raise InputError(f"{path}: cannot read as Arrow: {error}") from error
    yield from _iter_table_batches(batches, str(path))


def _load_datasets_dir(path: Path):
    from datasets import DatasetDict, load_from_disk

    loaded = load_from_disk(str(path))
    if isinstance(loaded, DatasetDict):
        return [(f"{path}[{split}]", loaded[split]) for split in loaded]
    return [(str(path), loaded)]


def _iter_datasets_dir(path: Path) -> Iterator[RawRecord]:
    for label, dataset in _load_datasets_dir(path):
        # The dataset is memory-mapped: iterating its Arrow table reads one batch at a time.
        yield from _iter_table_batches(dataset.data.to_batches(max_chunksize=BATCH_ROWS), label)


def iter_records(paths: Iterable[Path], max_row_bytes: int | None = None) -> Iterator[RawRecord]:
    """Stream the raw rows of every input, file after file (JSONL lines over `max_row_bytes` are
    measured and skipped unread)."""
    for path in paths:
        if path.is_dir():
            yield from _iter_datasets_dir(path)
        elif _suffix(path) in PARQUET_SUFFIXES:
            yield from _iter_parquet(path)
        elif _suffix(path) in ARROW_SUFFIXES:
            yield from _iter_arrow(path)
        else:
            yield from _iter_jsonl(path, max_row_bytes)


def count_rows(paths: Iterable[Path]) -> int:
    """Rows the inputs hold (non-blank JSONL lines; table metadata), read cheaply for progress ETA."""
    total = 0
    for path in paths:
        if path.is_dir():
            total += sum(len(dataset) for _, dataset in _load_datasets_dir(path))
        elif _suffix(path) in PARQUET_SUFFIXES:
            import pyarrow.parquet as pq

            total += pq.ParquetFile(path).metadata.num_rows
        elif _suffix(path) in ARROW_SUFFIXES:
            total += sum(batch.num_rows for batch in _open_arrow(path))
        else:
            # Bytes: a count must not fail on (or decode) what the reader reports line by line.
            with gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb") as handle:
                total += sum(1 for line in handle if line.strip())
    return total


def _text_content(value: Any, where: str, index: int) -> str:
    """Message content as text: OpenAI allows a string, null, or a list of typed parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in (None, "text") and isinstance(
                part.get("text"), str
            ):
                texts.append(part["text"])
            else:
                raise InputError(
                    f"{where}: message {index}: content part {part!r:.80} is not text; "
                    "only text conversations can be tokenized"
                )
        return "".join(texts)
    raise InputError(f"{where}: message {index}: content must be a string, got {type(value).__name__}")


def _split_inline_reasoning(content: str) -> tuple[str, str] | None:
    """`<think>r</think>c` written into content (ShareGPT, some engines) -> (r, c), as Qwen3 templates do."""
    if "</think>" not in content:
        return None
    reasoning, _, answer = content.partition("</think>")
    return reasoning.split("<think>")[-1].strip("\n"), answer.lstrip("\n")


def _normalize_message(message: Any, where: str, index: int, sharegpt: bool) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise InputError(f"{where}: message {index} must be an object, got {type(message).__name__}")
    if sharegpt:
        speaker = message.get("from")
        if not isinstance(speaker, str) or speaker.lower() not in SHAREGPT_ROLES:
            raise InputError(
                f"{where}: conversations[{index}]: unknown speaker {speaker!r} "
                f"(expected one of {sorted(SHAREGPT_ROLES)})"
            )
        normalized: dict[str, Any] = {
            "role": SHAREGPT_ROLES[speaker.lower()],
            "content": _text_content(message.get("value"), where, index),
        }
    else:
        role = message.get("role")
        if role not in ROLES:
            raise InputError(
                f"{where}: message {index}: unknown role {role!r} (expected one of {sorted(ROLES)})"
            )
        normalized = {key: value for key, value in message.items() if value is not None}
        normalized["content"] = _text_content(message.get("content"), where, index)
    if normalized["role"] == "assistant":
        reasoning = normalized.pop("reasoning", None)  # vLLM's field name
        reasoning = normalized.get("reasoning_content", reasoning)
        if reasoning is not None and not isinstance(reasoning, str):
            raise InputError(f"{where}: message {index}: reasoning_content must be a string")
        if reasoning is None:
            split = _split_inline_reasoning(normalized["content"])
            if split is not None:
                reasoning, normalized["content"] = split
        # "" (an empty think block the model wrote) and None (no think block) train differently.
        normalized.pop("reasoning_content", None)
        if reasoning is not None:
            normalized["reasoning_content"] = reasoning
    return normalized


def _token_ids(row: dict[str, Any], key: str, where: str) -> list[int] | None:
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        raise InputError(f"{where}: {key} must be a list of integers")
    return value


def parse_record(record: RawRecord) -> dict[str, Any]:
    """The JSON object behind a record, or an `InputError` naming its file and line."""
    if record.row is not None:
        return record.row
    try:
        value = json.loads(record.line or "")
    except json.JSONDecodeError as error:
        raise InputError(f"{record.where}: invalid JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(value, dict):
        raise InputError(f"{record.where}: expected a JSON object, got {type(value).__name__}")
    return value


def normalize_row(record: RawRecord) -> dict[str, Any]:
    """A checked conversation: `id`, OpenAI-style `messages`, and the optional engine fields."""
    where = record.where
    row = parse_record(record)
    row_id = row.get("id")
    if isinstance(row_id, int) and not isinstance(row_id, bool):
        row_id = str(row_id)
    if not isinstance(row_id, str) or not row_id:
        raise InputError(f"{where}: missing or empty string field 'id'")
    if row.get("messages") is not None:
        raw_messages, sharegpt = row["messages"], False
    elif row.get("conversations") is not None:
        raw_messages, sharegpt = row["conversations"], True
    else:
        raise InputError(f"{where}: row {row_id!r} has neither 'messages' nor 'conversations'")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise InputError(f"{where}: row {row_id!r}: messages must be a non-empty list")
    messages = [
        _normalize_message(message, where, index, sharegpt) for index, message in enumerate(raw_messages)
    ]
    finish_reason = row.get("finish_reason")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise InputError(f"{where}: row {row_id!r}: finish_reason must be a string or null")
    return {
        "id": row_id,
        "messages": messages,
        "finish_reason": finish_reason,
        "prompt_token_ids": _token_ids(row, "prompt_token_ids", where),
        "completion_token_ids": _token_ids(row, "completion_token_ids", where),
        "where": where,
    }
