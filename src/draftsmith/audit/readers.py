"""Readers for the two data contracts: conversation rows and tokenized datasets.

Tokenized data is read as Arrow record batches (Parquet shards, one Parquet file, Arrow IPC
files/streams, `datasets.save_to_disk` directories) so the audit streams in bounded memory.
Conversation rows come one at a time, with unreadable rows reported by file and line instead of
stopping the audit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.core.errors import InputError
from draftsmith.generate.store import generated_row_files

TOKENIZED_COLUMNS = ("id", "input_ids", "loss_mask", "num_tokens", "num_trainable", "finish_reason")
CONVERSATION_SUFFIXES = (".jsonl", ".json", ".ndjson")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "bing": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_call": "assistant",
}


# -- discovery -------------------------------------------------------------------------------------


def _dataset_dir_arrow_files(directory: Path) -> list[Path] | None:
    """Arrow files of a `datasets.save_to_disk` directory (Dataset or DatasetDict), else None."""
    state = directory / "state.json"
    if state.is_file():
        try:
            files = [directory / entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
        except (KeyError, TypeError, ValueError) as error:
            raise InputError(f"{state}: not a readable datasets state file ({error})") from None
        return files
    splits_file = directory / "dataset_dict.json"
    if splits_file.is_file():
        try:
            splits = json.loads(splits_file.read_text())["splits"]
        except (KeyError, ValueError) as error:
            raise InputError(f"{splits_file}: not a readable DatasetDict file ({error})") from None
        files: list[Path] = []
        for split in splits:
            files.extend(_dataset_dir_arrow_files(directory / split) or [])
        return files
    return None


def data_files(path: str | Path) -> list[Path]:
    """The concrete files behind a path: itself, the shards of a directory, or a datasets dir."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    saved = _dataset_dir_arrow_files(path)
    if saved is not None:
        return saved
    generated = generated_row_files(path)
    if generated:
        return generated
    for pattern in ("*.parquet", "*.arrow", "*.jsonl", "*.ndjson", "*.json"):
        found = sorted(p for p in path.rglob(pattern) if p.is_file() and not p.name.startswith("."))
        if found:
            return found
    raise InputError(f"{path}: directory holds no .parquet, .arrow, .jsonl or datasets files")


def _schema_names(file: Path) -> list[str]:
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        return pq.read_schema(file).names
    if suffix == ".arrow":
        return _open_arrow(file).schema.names
    raise ValueError(suffix)


def detect_kind(paths: list[str | Path]) -> str:
    """'tokenized' when the data has input_ids + loss_mask, 'conversations' for message rows."""
    kinds = set()
    for path in paths:
        for file in data_files(path)[:1]:
            if file.suffix.lower() in CONVERSATION_SUFFIXES:
                kinds.add("conversations")
                continue
            try:
                names = _schema_names(file)
            except (ValueError, pa.ArrowInvalid, OSError) as error:
                raise InputError(f"{file}: cannot read as Parquet/Arrow/JSONL ({error})") from None
            if "input_ids" in names:
                kinds.add("tokenized")
            elif "messages" in names or "conversations" in names:
                kinds.add("conversations")
            else:
                raise InputError(
                    f"{file}: neither tokenized (input_ids, loss_mask) nor conversations "
                    f"(messages or conversations); columns are {', '.join(names)}"
                )
    if len(kinds) != 1:
        raise InputError("mixed inputs: pass either conversation files or tokenized datasets, not both")
    return kinds.pop()


# -- tokenized -------------------------------------------------------------------------------------


class _ArrowReader:
    def __init__(self, file: Path):
        self.file = file
        self.source = pa.memory_map(str(file), "r")
        try:
            self.reader = pa.ipc.open_file(self.source)
            self.is_stream = False
        except pa.ArrowInvalid:
            self.source.seek(0)
            self.reader = pa.ipc.open_stream(self.source)  # what datasets writes
            self.is_stream = True
        self.schema = self.reader.schema

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self.is_stream:
            yield from self.reader
        else:
            for index in range(self.reader.num_record_batches):
                yield self.reader.get_batch(index)


def _open_arrow(file: Path) -> _ArrowReader:
    try:
        return _ArrowReader(file)
    except (pa.ArrowInvalid, OSError) as error:
        raise InputError(f"{file}: not an Arrow IPC file or stream ({error})") from None


def _split(batch: pa.RecordBatch, batch_size: int) -> Iterator[pa.RecordBatch]:
    if batch.num_rows <= batch_size:
        yield batch
        return
    for start in range(0, batch.num_rows, batch_size):
        yield batch.slice(start, batch_size)


def iter_tokenized_batches(path: str | Path, batch_size: int = 16384) -> Iterator[tuple[Path, pa.RecordBatch]]:
    """(file, record batch) pairs with the contract-2 columns that are present."""
    for file in data_files(path):
        suffix = file.suffix.lower()
        if suffix == ".parquet":
            try:
                parquet = pq.ParquetFile(file)
            except (pa.ArrowInvalid, OSError) as error:
                raise InputError(f"{file}: not a readable Parquet file ({error})") from None
            names = parquet.schema_arrow.names
            _require_tokenized_columns(file, names)
            columns = [name for name in TOKENIZED_COLUMNS if name in names]
            for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
                yield file, batch
        elif suffix == ".arrow":
            reader = _open_arrow(file)
            names = reader.schema.names
            _require_tokenized_columns(file, names)
            columns = [name for name in TOKENIZED_COLUMNS if name in names]
            for batch in reader.batches():
                for piece in _split(batch.select(columns), batch_size):
                    yield file, piece
        else:
            raise InputError(f"{file}: a tokenized dataset must be Parquet or Arrow, not {suffix or 'no suffix'}")


def _require_tokenized_columns(file: Path, names: list[str]) -> None:
    missing = [name for name in ("input_ids", "loss_mask") if name not in names]
    if missing:
        raise InputError(
            f"{file}: tokenized data needs columns input_ids and loss_mask; missing {', '.join(missing)} "
            f"(columns are {', '.join(names)})"
        )


# -- conversations ---------------------------------------------------------------------------------


@dataclass
class ConversationRow:
    source: str  # "file:line" or "file:row N"
    id: str
    messages: list[dict[str, Any]]
    raw: dict[str, Any]


@dataclass
class BadRow:
    source: str
    problem: str

    @property
    def message(self) -> str:
        return f"{self.source}: {self.problem}"


def normalize_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI `messages` as-is; ShareGPT `conversations` mapped to role/content."""
    if "messages" in row and row["messages"] is not None:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ValueError(f"messages[{index}] has no 'role'")
        return messages
    if "conversations" in row and row["conversations"] is not None:
        turns = row["conversations"]
        if not isinstance(turns, list) or not turns:
            raise ValueError("'conversations' must be a non-empty list")
        messages = []
        for index, turn in enumerate(turns):
            if not isinstance(turn, dict) or "from" not in turn:
                raise ValueError(f"conversations[{index}] has no 'from'")
            role = SHAREGPT_ROLES.get(str(turn["from"]).lower())
            if role is None:
                raise ValueError(f"conversations[{index}] has unknown speaker {turn['from']!r}")
            message = {"role": role, "content": turn.get("value", "")}
            for key in ("reasoning_content", "reasoning"):
                if key in turn:
                    message[key] = turn[key]
            messages.append(message)
        return messages
    raise ValueError("no 'messages' or 'conversations' field")


def _row(source: str, fallback_id: str, row: Any) -> ConversationRow | BadRow:
    if not isinstance(row, dict):
        return BadRow(source, f"expected a JSON object, got {type(row).__name__}")
    try:
        messages = normalize_messages(row)
    except ValueError as error:
        return BadRow(source, str(error))
    row_id = row.get("id")
    return ConversationRow(source, str(row_id) if row_id is not None else fallback_id, messages, row)


def iter_conversation_rows(paths: list[str | Path]) -> Iterator[ConversationRow | BadRow]:
    for path in paths:
        for file in data_files(path):
            suffix = file.suffix.lower()
            if suffix in (".jsonl", ".ndjson"):
                yield from _jsonl_rows(file)
            elif suffix == ".json":
                yield from _json_rows(file)
            elif suffix in (".parquet", ".arrow"):
                yield from _columnar_rows(file)
            else:
                raise InputError(f"{file}: conversations must be .jsonl, .json or .parquet")


def _jsonl_rows(file: Path) -> Iterator[ConversationRow | BadRow]:
    with file.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            source = f"{file}:{number}"
            try:
                row = json.loads(line)
            except ValueError as error:
                yield BadRow(source, f"bad JSON ({error})")
                continue
            yield _row(source, f"{file.name}:{number}", row)


def _json_rows(file: Path) -> Iterator[ConversationRow | BadRow]:
    try:
        data = json.loads(file.read_text())
    except ValueError:
        # Many ".json" files are really JSON Lines.
        yield from _jsonl_rows(file)
        return
    rows = data if isinstance(data, list) else [data]
    for index, row in enumerate(rows):
        yield _row(f"{file}: item {index}", f"{file.name}#{index}", row)


def _columnar_rows(file: Path) -> Iterator[ConversationRow | BadRow]:
    if file.suffix.lower() == ".parquet":
        batches = pq.ParquetFile(file).iter_batches(batch_size=4096)
    else:
        batches = _open_arrow(file).batches()
    index = 0
    for batch in batches:
        for row in batch.to_pylist():
            yield _row(f"{file}: row {index}", f"{file.name}#{index}", row)
            index += 1
