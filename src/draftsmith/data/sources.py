"""Opening row sources: which files a path stands for, and their rows one at a time.

Accepted: JSON Lines (``.jsonl``, ``.ndjson``, gzipped too), ``.json`` (an array of rows, or JSON
Lines under a ``.json`` name), Parquet, Arrow (IPC file or stream), ``datasets.save_to_disk``
directories (Dataset or DatasetDict), a ``generate`` output directory (its row shards only) and
folders of any of these, walked recursively in sorted order.

One split rule for a DatasetDict, the same in every stage: the split named by ``split``, else
``train`` when there is one, else the only split, else an error listing the splits.

Rows stream: a `Record` is a raw JSONL line or an already decoded table row plus where it came
from (``file:line`` or ``file: row N``, N counted from 0), so parsing can run in worker processes.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.core.limits import MAX_ROW_BYTES_ENV
from draftsmith.core.limits import max_row_bytes as resolve_max_row_bytes
from draftsmith.core.lines import OversizedLine, iter_lines
from draftsmith.core.manifest import read_manifest
from draftsmith.core.lock import live_writer

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json.gz")
JSON_SUFFIXES = (".json",)
TABLE_SUFFIXES = (".parquet", ".arrow")
ROW_SUFFIXES = JSONL_SUFFIXES + JSON_SUFFIXES + TABLE_SUFFIXES
#: the row shards of a `generate` output directory; its summary and failures files are bookkeeping
GENERATED_ROW_GLOB = "generated-*.jsonl"
GENERATED_BOOKKEEPING_GLOB = "failures-s*of*.jsonl"
BATCH_ROWS = 1024


@dataclass(frozen=True)
class Record:
    """One input row before parsing: `line` is raw JSON text, `row` an already decoded row."""

    where: str
    line: str | None = None
    row: Any = None
    oversized: int | None = None
    """Bytes of a JSONL line over the row-size limit: it was measured and skipped, never read whole."""
    columnar: bool = False
    """From a Parquet/Arrow table, which gives every row every column: null there can mean absent."""

    def parse(self) -> Any:
        """The decoded row, or an `InputError` naming its file and line."""
        if self.oversized is not None:
            raise InputError(f"{self.where}: {oversized_text(self.oversized)}")
        if self.line is None:
            return self.row
        try:
            row = json.loads(self.line)
        except json.JSONDecodeError as error:
            raise InputError(f"{self.where}: invalid JSON: {error.msg} at column {error.pos + 1}") from None
        except RecursionError:
            raise InputError(f"{self.where}: invalid JSON: nested too deeply") from None
        if _SURROGATE_ESCAPE.search(self.line):
            check_strings(row, self.where)
        return row


#: a JSON escape of a UTF-16 surrogate: valid only as a pair, so decoded strings must be checked
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def check_strings(value: Any, where: str, path: str = "") -> None:
    """`InputError` for a string that is not text: a lone UTF-16 surrogate (``"\\ud800"`` in JSON
    decodes to one) cannot be encoded, tokenized or written back."""
    stack = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            bad = _LONE_SURROGATE.search(item)
            if bad is not None:
                field = f" in {at.lstrip('.')}" if at else ""
                raise InputError(
                    f"{where}: malformed string{field}: a lone UTF-16 surrogate {ascii(bad.group())} at "
                    f"character {bad.start()} (text must be valid Unicode)"
                )
        elif isinstance(item, dict):
            stack.extend((child, f"{at}.{key}") for key, child in item.items())
            stack.extend((key, at) for key in item if isinstance(key, str))
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{index}]") for index, child in enumerate(item))


def suffix_of(path: Path) -> str:
    name = path.name.lower()
    for suffix in ROW_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return path.suffix.lower()


def generated_row_files(directory: str | Path) -> list[Path] | None:
    """The row shards of a `generate` output directory (an empty list when it has none: every
    sample failed), or None when `directory` is not one. Its failures, summary and manifest files
    are bookkeeping, never rows, even when they are all the directory holds."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    rows = sorted(path for path in directory.glob(GENERATED_ROW_GLOB) if path.is_file())
    if rows:
        return rows
    bookkeeping = any(directory.glob(GENERATED_BOOKKEEPING_GLOB)) or any(directory.glob("summary-s*of*.json"))
    manifest = read_manifest(directory) if (directory / "manifest.json").is_file() else None
    if bookkeeping or (manifest or {}).get("stage") == "generate":
        return []
    return None


def check_finished(inputs: Iterable[str | Path], allow_partial: bool, flag: str = "--allow-partial") -> list[str]:
    """Refuse an input whose draftsmith writer is still running (a generate or tokenize directory, or
    a file in one, whose lock a live process holds): what is there now is a part, not the output.

    With ``allow_partial`` the part is used on purpose: said on stderr and returned (one line per
    input) for the reader to record in its manifest.
    """
    used: list[str] = []
    for item in inputs:
        path = Path(item)
        directory = path if path.is_dir() else path.parent
        writer = live_writer(directory)
        if writer is None:
            continue
        note = f"{path}: still being written by {writer}"
        if not allow_partial:
            raise InputError(f"{note}; wait for it to finish, or pass {flag} to use what is written so far")
        print(f"draftsmith: warning: {note}; using what is written so far ({flag})", file=sys.stderr, flush=True)
        used.append(note)
    return used


def choose_split(splits: list[str], split: str | None, where: str) -> str:
    """The one DatasetDict split rule (see the module docstring)."""
    if split is not None:
        if split not in splits:
            raise InputError(f"{where}: no split {split!r}; the splits are {', '.join(splits)}")
        return split
    if "train" in splits:
        return "train"
    if len(splits) == 1:
        return splits[0]
    raise InputError(f"{where}: a DatasetDict with splits {', '.join(splits)} and none is 'train'; pass --split NAME")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: not a readable datasets file ({error})") from None


def datasets_dir_files(directory: Path, split: str | None = None) -> list[Path] | None:
    """Arrow files of a `save_to_disk` directory (one split of a DatasetDict), else None."""
    state = directory / "state.json"
    if state.is_file():
        try:
            return [directory / entry["filename"] for entry in _read_json(state)["_data_files"]]
        except (KeyError, TypeError):
            raise InputError(f"{state}: not a readable datasets state file") from None
    splits_file = directory / "dataset_dict.json"
    if splits_file.is_file():
        try:
            splits = list(_read_json(splits_file)["splits"])
        except (KeyError, TypeError):
            raise InputError(f"{splits_file}: not a readable DatasetDict file") from None
        chosen = choose_split(splits, split, str(directory))
        return datasets_dir_files(directory / chosen) or []
    return None


def _first_visit(path: Path, seen: set[tuple[int, int]]) -> bool:
    """Whether ``path`` (a directory or file, links followed) is met for the first time in a walk.

    Folders are walked through links, so a link to a folder itself or to one above it (a cycle),
    or two links to one file, would otherwise read the same rows again and again."""
    try:
        status = path.stat()
    except OSError:  # a dangling link: nothing to read there
        return False
    key = (status.st_dev, status.st_ino)
    if key in seen:
        return False
    seen.add(key)
    return True


def _walk(directory: Path, suffixes: tuple[str, ...], split: str | None, seen: set[tuple[int, int]] | None = None) -> list[Path]:
    seen = set() if seen is None else seen
    if not _first_visit(directory, seen):
        return []
    saved = datasets_dir_files(directory, split)
    if saved is not None:
        return saved
    generated = generated_row_files(directory)
    if generated == []:
        raise InputError(f"{directory}: a generate output directory without generated rows (every sample failed; "
                         "their reasons are in its failures-*.jsonl)")
    if generated and ".jsonl" in suffixes:
        return generated
    found: list[Path] = []
    for child in sorted(directory.iterdir()):
        if child.name.startswith((".", "_")):
            continue
        if child.is_dir():
            found.extend(_walk(child, suffixes, split, seen))
        elif child.is_file() and suffix_of(child) in suffixes and _first_visit(child, seen):
            found.append(child)
    return found


def holds_dataset_dict(directory: Path, seen: set[tuple[int, int]] | None = None) -> bool:
    """Whether a folder is, or holds, a ``save_to_disk`` DatasetDict (what ``--split`` chooses in)."""
    seen = set() if seen is None else seen
    if not _first_visit(directory, seen):
        return False
    if (directory / "dataset_dict.json").is_file():
        return True
    if (directory / "state.json").is_file() or generated_row_files(directory) is not None:
        return False
    return any(
        holds_dataset_dict(child, seen) for child in sorted(directory.iterdir())
        if child.is_dir() and not child.name.startswith((".", "_"))
    )


def _is_dataset_dict_input(item: str | Path) -> bool:
    return Path(item).is_dir() and holds_dataset_dict(Path(item))


def check_split(inputs: list[str | Path], split: str | None) -> None:
    """A `split` is a choice among a DatasetDict's splits: an `InputError` when no input is one
    (it would be silently ignored)."""
    if split is None or any(_is_dataset_dict_input(item) for item in inputs):
        return
    if all(Path(item).exists() for item in inputs):  # else resolve names the missing path
        names = ", ".join(str(item) for item in inputs) or "the input"
        raise InputError(
            f"{names}: --split {split!r} chooses a split of a DatasetDict (a datasets.save_to_disk "
            "directory with splits), and no input is one; drop --split"
        )


def resolve(
    inputs: str | Path | Iterable[str | Path], split: str | None = None, suffixes: tuple[str, ...] = ROW_SUFFIXES
) -> list[Path]:
    """The data files behind `inputs`, in a stable order; an `InputError` for a missing path,
    an unknown file kind, a folder without data, or a `split` when no input is a DatasetDict."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    inputs = list(inputs)
    check_split(inputs, split)
    kinds = ", ".join(suffixes)
    files: list[Path] = []
    seen: set[tuple[int, int]] = set()  # one walk over all inputs: a folder reached twice is read once
    for item in inputs:
        path = Path(item)
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_dir():
            status = path.stat()
            if (status.st_dev, status.st_ino) in seen:
                continue  # the same folder given twice (or inside another input): read once
            found = _walk(path, suffixes, split, seen)
            if not found:
                raise InputError(f"{path}: directory holds no {kinds} or datasets files")
            files.extend(found)
        elif suffix_of(path) in suffixes:
            files.append(path)
        else:
            raise InputError(f"{path}: unknown input format (expected {kinds} or a datasets directory)")
    if not files:
        raise InputError("no input files given")
    return files


# -- streaming -------------------------------------------------------------------------------------


def _is_json_array(path: Path) -> bool:
    """Whether a ``.json`` file holds one JSON array (else JSON Lines); read as bytes, so a file
    that is not UTF-8 is reported where its rows are read, with its line."""
    try:
        with gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb") as handle:
            head = handle.read(4096)
            while head and not head.lstrip(b" \t\r\n\xef\xbb\xbf"):
                head = handle.read(4096)
    except (OSError, EOFError, zlib.error) as error:
        raise InputError(f"{path}: cannot read ({error})") from None
    return head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] == b"["


def _json_array_rows(path: Path) -> tuple[list[Any], bool]:
    """The rows of a JSON array file, and whether its strings need `check_strings` (it escapes a
    surrogate), or a one-line `InputError` naming the file and line."""
    try:
        with gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb") as handle:
            data = handle.read()
    except (OSError, EOFError, zlib.error) as error:
        raise InputError(f"{path}: cannot read ({error})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        bad = data[error.start : error.start + 4]
        raise InputError(f"{path}:{line}: not valid UTF-8 (byte {error.start} of the file: {bad!r}); JSON must be UTF-8") from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{path}:{error.lineno}: invalid JSON: {error.msg} at column {error.colno}") from None
    except RecursionError:
        raise InputError(f"{path}: invalid JSON: nested too deeply") from None
    if not isinstance(rows, list):
        raise InputError(f"{path}: expected a JSON array of rows")
    return rows, _SURROGATE_ESCAPE.search(text) is not None


class ArrowFile:
    """An Arrow IPC file or stream (what `datasets` writes), read batch by batch."""

    def __init__(self, path: Path):
        import pyarrow as pa

        self.path = path
        try:
            source = pa.memory_map(str(path), "r")
            try:
                self._reader = pa.ipc.open_file(source)
                self._stream = False
            except pa.ArrowInvalid:
                source.seek(0)
                self._reader = pa.ipc.open_stream(source)
                self._stream = True
        except (pa.ArrowInvalid, OSError) as error:
            raise InputError(f"{path}: not an Arrow IPC file or stream ({error})") from None
        self.schema = self._reader.schema

    def batches(self) -> Iterator[Any]:
        if self._stream:
            yield from self._reader
        else:
            for index in range(self._reader.num_record_batches):
                yield self._reader.get_batch(index)


def _parquet(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise InputError(f"{path}: not a readable Parquet file ({error})") from None


def column_names(path: Path) -> list[str]:
    """Column names of a Parquet or Arrow file."""
    if suffix_of(path) == ".parquet":
        return _parquet(path).schema_arrow.names
    return ArrowFile(path).schema.names


def table_batches(path: Path, columns: list[str] | None = None, batch_size: int = BATCH_ROWS) -> Iterator[Any]:
    """Record batches of a Parquet or Arrow file, at most `batch_size` rows each."""
    if suffix_of(path) == ".parquet":
        yield from _parquet(path).iter_batches(batch_size=batch_size, columns=columns)
        return
    for batch in ArrowFile(path).batches():
        if columns is not None:
            batch = batch.select(columns)
        for start in range(0, batch.num_rows, batch_size):
            yield batch.slice(start, batch_size)


def oversized_text(size: int) -> str:
    return f"a row of {size:,} bytes, over the row-size limit (default 64 MiB, ${MAX_ROW_BYTES_ENV} sets it); skipped unread"


def iter_records(files: Iterable[Path], max_row_bytes: int | None = None) -> Iterator[Record]:
    """Every row of every file, file after file, without parsing JSON lines. A JSONL line over
    the row-size limit (`max_row_bytes`, else `core.limits.max_row_bytes()`: 64 MiB by default)
    is measured a block at a time, never held whole, and comes back as a `Record` with only
    `oversized` set: each reader counts and skips it (`Record.parse` refuses it, naming it)."""
    max_row_bytes = resolve_max_row_bytes(max_row_bytes)
    for path in files:
        kind = suffix_of(path)
        if kind in TABLE_SUFFIXES:
            index = 0
            for batch in table_batches(path):
                for row in batch.to_pylist():
                    yield Record(f"{path}: row {index}", row=row, columnar=True)
                    index += 1
        elif kind in JSON_SUFFIXES and _is_json_array(path):
            rows, check = _json_array_rows(path)
            for index, row in enumerate(rows):
                if check:
                    check_strings(row, f"{path}: row {index}")
                yield Record(f"{path}: row {index}", row=row)
        else:
            yield from _jsonl_records(path, max_row_bytes)


def _jsonl_records(path: Path, max_row_bytes: int | None) -> Iterator[Record]:
    lines = iter_lines(path, max_row_bytes)
    while True:
        try:
            number, line = next(lines)
        except StopIteration:
            return
        except (OSError, EOFError, zlib.error) as error:  # a corrupt or truncated .gz, a read error
            raise InputError(f"{path}: cannot read ({error})") from None
        if isinstance(line, OversizedLine):
            yield Record(f"{path}:{number}", oversized=line.size)
        else:
            yield Record(f"{path}:{number}", line=line)


def skip_oversized(records: Iterable[Record], log: Callable[[str], None] | None = None) -> Iterator[Record]:
    """`records` without the oversized ones, each of which is reported on one line (stderr by default)."""
    for record in records:
        if record.oversized is None:
            yield record
            continue
        message = f"{record.where}: {oversized_text(record.oversized)}"
        if log is None:
            print(f"draftsmith: {message}", file=sys.stderr)
        else:
            log(message)


def count_records(files: Iterable[Path]) -> int:
    """Rows the files hold, read cheaply (table metadata, line counts) for a progress ETA."""
    total = 0
    for path in files:
        kind = suffix_of(path)
        if kind == ".parquet":
            total += _parquet(path).metadata.num_rows
        elif kind == ".arrow":
            total += sum(batch.num_rows for batch in ArrowFile(path).batches())
        elif kind in JSON_SUFFIXES and _is_json_array(path):
            total += len(_json_array_rows(path)[0])
        else:
            # Bytes: counting must not fail on (or decode) what the reader reports line by line.
            try:
                with gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb") as handle:
                    total += sum(1 for line in handle if line.strip())
            except (OSError, EOFError, zlib.error) as error:
                raise InputError(f"{path}: cannot read ({error})") from None
    return total


def detect_kind(inputs: str | Path | Iterable[str | Path], split: str | None = None) -> str:
    """``"tokenized"`` for contract-2 data (``input_ids`` column), ``"conversations"`` for rows."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    inputs = list(inputs)
    check_split(inputs, split)
    kinds = set()
    for item in inputs:
        for file in resolve(item, split if _is_dataset_dict_input(item) else None)[:1]:
            if suffix_of(file) not in TABLE_SUFFIXES:
                kinds.add("conversations")
                continue
            names = column_names(file)
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
