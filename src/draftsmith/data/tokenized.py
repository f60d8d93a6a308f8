"""Data contract 2, tokenized rows: memory-mapped Arrow shards, one checked reader, one atomic writer.

On disk, a tokenized dataset is a directory of uncompressed Arrow IPC files ``part-00000.arrow``,
... (so they memory-map) with the columns of `SCHEMA`: ``input_ids`` (list<int32>) and
``loss_mask`` (list<int8>) are each one values buffer plus an offsets index, and ``num_tokens`` /
``num_trainable`` count each row. Every shard's schema metadata ``draftsmith.tokenized`` holds what
its writer checked and counted: rows, tokens, trainable tokens, the largest token id and a sha256 of
the content (ids, lengths, token ids, masks). A tokenize run writes ``tokenize_summary.json`` last.

`load_tokenized` memory-maps the shards: a sample is two numpy views cut out of the values by the
offsets when it is asked for; start-up builds nothing per sample and resident memory does not grow
with the sample count. Every other input (the Parquet shards of earlier draftsmith versions, one
Parquet file, foreign Arrow files, `datasets.save_to_disk` directories, one split by the
`data.sources` rule) is checked row by row and converted once into the cache
(``$DRAFTSMITH_CACHE/tokenized``, default ``~/.cache/draftsmith/tokenized``), keyed by the file's
path, size and modification time; a line on stderr says so. Rows keep the order of the files
(sorted by name) and of the rows inside them: offline features are addressed by that order and by id.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import operator
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftsmith.core.errors import InputError
from draftsmith.core.io import atomic_path, fresh_file
from draftsmith.core.paths import require_utf8_path
from draftsmith.data.sources import TABLE_SUFFIXES, column_names, resolve, suffix_of, table_batches

SHARD_PATTERN = "part-{index:05d}.arrow"
#: shard names a tokenize output directory may hold; ``.parquet`` ones were written before Arrow
SHARD_GLOBS = ("part-*.arrow", "part-*.parquet")
SUMMARY_NAME = "tokenize_summary.json"
META_KEY = b"draftsmith.tokenized"
FORMAT_VERSION = 1
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("num_tokens", pa.int32()),
        ("num_trainable", pa.int32()),
        ("finish_reason", pa.string()),
    ]
)
COLUMNS = tuple(SCHEMA.names)
REQUIRED = ("input_ids", "loss_mask")
CONVERT_BATCH_ROWS = 4096


# -- checking rows ---------------------------------------------------------------------------------


def tokenized_files(path: str | Path | Iterable[str | Path], split: str | None = None) -> list[Path]:
    """The Arrow/Parquet files of a tokenized dataset (see the module docstring)."""
    for given in [path] if isinstance(path, (str, Path)) else list(path):
        require_utf8_path(given, "tokenized data")  # Arrow takes only UTF-8 paths
    return resolve(path, split, TABLE_SUFFIXES)


def _require_columns(file: Path, names: list[str]) -> None:
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise InputError(
            f"{file}: tokenized data needs columns input_ids and loss_mask; missing column(s) "
            f"{', '.join(missing)} (columns are {', '.join(names)})"
        )


def iter_tokenized_batches(
    path: str | Path | Iterable[str | Path], batch_size: int = 16384, split: str | None = None
) -> Iterator[tuple[Path, pa.RecordBatch]]:
    """(file, record batch) pairs holding the contract-2 columns that are present."""
    for file in tokenized_files(path, split):
        names = column_names(file)
        _require_columns(file, names)
        columns = [name for name in COLUMNS if name in names]
        for batch in table_batches(file, columns, batch_size):
            yield file, batch


@dataclass
class CheckedBatch:
    """The rows of one record batch, checked: ids, per-row lengths and the flat token ids / masks."""

    ids: list[str]
    lengths: np.ndarray  # int64 [rows]
    tokens: np.ndarray  # int32 [sum(lengths)]
    mask: np.ndarray  # int8 [sum(lengths)]

    @property
    def offsets(self) -> np.ndarray:
        return _offsets(self.lengths)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _flat_values(column: pa.Array, name: str, where) -> np.ndarray:
    values = pc.list_flatten(column)
    if not (pa.types.is_integer(values.type) or pa.types.is_boolean(values.type)):
        raise InputError(f"{where(0)}: {name} must hold integers, not {values.type}")
    if values.null_count:
        raise InputError(f"{where(None)}: {name} holds a null value")
    return values.to_numpy(zero_copy_only=False)


def check_batch(file: Path, first_row: int, batch: pa.RecordBatch) -> CheckedBatch:
    """Check one batch of contract-2 rows, vectorised; a bad row raises `InputError` naming
    file, row and id (rows are counted from `first_row` within `file`)."""
    rows = batch.num_rows
    raw_ids = batch.column("id").to_pylist() if "id" in batch.schema.names else [None] * rows
    ids = [str(value) if value is not None else f"{file.name}:{first_row + row}" for row, value in enumerate(raw_ids)]
    tokens_column, mask_column = batch.column("input_ids"), batch.column("loss_mask")

    def where(row: int | None) -> str:
        return f"{file}: row {first_row + row} (id {ids[row]})" if row is not None else f"{file}: rows {first_row}.."

    lengths = pc.fill_null(pc.list_value_length(tokens_column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    mask_lengths = pc.fill_null(pc.list_value_length(mask_column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    empty = np.flatnonzero((lengths == 0) | (mask_lengths == 0))
    if empty.size:
        raise InputError(f"{where(int(empty[0]))}: empty input_ids or loss_mask")
    unequal = np.flatnonzero(lengths != mask_lengths)
    if unequal.size:
        row = int(unequal[0])
        raise InputError(f"{where(row)}: input_ids has {lengths[row]} tokens but loss_mask has {mask_lengths[row]}")
    offsets = _offsets(lengths)

    def row_of(position: int) -> int:
        return int(np.searchsorted(offsets, position, side="right")) - 1

    tokens = _flat_values(tokens_column, "input_ids", where)
    mask = _flat_values(mask_column, "loss_mask", where)
    negative = np.flatnonzero(tokens < 0)
    if negative.size:
        raise InputError(f"{where(row_of(int(negative[0])))}: negative token id {int(tokens[negative[0]])}")
    too_big = np.flatnonzero(tokens > np.iinfo(np.int32).max)
    if too_big.size:
        raise InputError(f"{where(row_of(int(too_big[0])))}: token id {int(tokens[too_big[0]])} does not fit in int32")
    invalid = np.flatnonzero((mask != 0) & (mask != 1))
    if invalid.size:
        raise InputError(f"{where(row_of(int(invalid[0])))}: loss_mask must be 0/1, found {int(mask[invalid[0]])}")
    return CheckedBatch(ids, lengths, tokens.astype(np.int32, copy=False), mask.astype(np.int8, copy=False))


@dataclass
class TokenizedSample:
    """One training sequence: token ids and the 0/1 mask of response (trainable) tokens.

    From `load_tokenized` both are views into the memory-mapped shard (a private copy-on-write map:
    writing to them never changes the file); read them, copy them to keep changes.
    """

    id: str
    input_ids: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # int8 [T]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_trainable(self) -> int:
        return int(self.loss_mask.sum())


class _ContentDigest:
    """The sha256 of a shard's content, fed batch by batch: ids, row lengths, token ids, masks."""

    def __init__(self):
        self._digest = hashlib.sha256(f"draftsmith.tokenized.v{FORMAT_VERSION}".encode())

    def update(self, batch: CheckedBatch) -> None:
        self._digest.update(("\0".join(batch.ids) + "\0").encode())
        # Contiguous little-endian views hash without a copy (the bytes are those of ``tobytes()``).
        for values, dtype in ((batch.lengths, "<i8"), (batch.tokens, "<i4"), (batch.mask, "i1")):
            self._digest.update(np.ascontiguousarray(values, dtype=dtype).data)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def _record_batch(batch: CheckedBatch, finish_reasons: list[str | None] | None) -> pa.RecordBatch:
    offsets = pa.array(batch.offsets.astype(np.int32))
    trainable = np.add.reduceat(batch.mask, batch.offsets[:-1], dtype=np.int64) if len(batch.ids) else []
    return pa.RecordBatch.from_arrays(
        [
            pa.array(batch.ids, type=pa.string()),
            pa.ListArray.from_arrays(offsets, pa.array(batch.tokens, type=pa.int32())),
            pa.ListArray.from_arrays(offsets, pa.array(batch.mask, type=pa.int8())),
            pa.array(batch.lengths.astype(np.int32)),
            pa.array(np.asarray(trainable, dtype=np.int32)),
            pa.array(finish_reasons or [None] * len(batch.ids), type=pa.string()),
        ],
        schema=SCHEMA,
    )


def _new_stats() -> dict[str, Any]:
    return {"version": FORMAT_VERSION, "rows": 0, "tokens": 0, "trainable": 0, "max_token_id": -1}


def _count(stats: dict[str, Any], digest: _ContentDigest, batch: CheckedBatch) -> None:
    digest.update(batch)
    stats["rows"] += len(batch.ids)
    stats["tokens"] += int(batch.lengths.sum())
    stats["trainable"] += int(batch.mask.sum(dtype=np.int64))
    stats["max_token_id"] = max(stats["max_token_id"], int(batch.tokens.max()))


def _write_arrow(path: Path, batches: Iterable[pa.RecordBatch], stats: dict[str, Any]) -> None:
    """Record batches as one uncompressed Arrow IPC file, with `stats` in its schema metadata."""
    schema = SCHEMA.with_metadata({META_KEY: json.dumps(stats).encode()})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def _write_shard(path: Path, batch: CheckedBatch, finish_reasons: list[str | None] | None) -> dict[str, Any]:
    """One checked batch as a memory-mappable shard at `path`, atomically; returns its stats."""
    stats, digest = _new_stats(), _ContentDigest()
    _count(stats, digest, batch)
    stats["sha256"] = digest.hexdigest()
    with atomic_path(path) as temporary:
        _write_arrow(temporary, [_record_batch(batch, finish_reasons)], stats)
    return stats


def _write_streamed(path: Path, batches: Iterable[tuple[CheckedBatch, list[str | None] | None]]) -> dict[str, Any]:
    """Checked batches streamed into one shard at `path` (not atomic: the caller renames it).

    The stats are known only after the last batch, so the batches go to a staging file first and
    its record batches are copied, zero-copy, into `path` under the finished metadata.
    """
    stats, digest = _new_stats(), _ContentDigest()
    staging = fresh_file(path.with_name(f".{path.name}.staging"))
    try:
        with pa.OSFile(str(staging), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
            for batch, finish_reasons in batches:
                if batch.ids:
                    _count(stats, digest, batch)
                    writer.write_batch(_record_batch(batch, finish_reasons))
        stats["sha256"] = digest.hexdigest()
        with pa.memory_map(str(staging), "r") as source:
            reader = pa.ipc.open_file(source)
            _write_arrow(path, (reader.get_batch(index) for index in range(reader.num_record_batches)), stats)
    finally:
        staging.unlink(missing_ok=True)
    return stats


def _check_rows(ids: list[str], input_ids: list[np.ndarray], masks: list[np.ndarray]) -> CheckedBatch:
    table = pa.record_batch(
        [pa.array(ids, type=pa.string()), _list_array(input_ids), _list_array(masks)], names=["id", *REQUIRED]
    )
    return check_batch(Path("<rows written>"), 0, table)


def _list_array(values: list[np.ndarray]) -> pa.Array:
    lengths = np.fromiter((len(item) for item in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([np.asarray(item).ravel() for item in values]) if values else np.zeros(0, np.int64)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))


def existing_shards(output_dir: Path) -> list[str]:
    """The shard names of a tokenize output directory, sorted (Arrow, and Parquet from before Arrow)."""
    return sorted({path.name for pattern in SHARD_GLOBS for path in output_dir.glob(pattern)})


def is_tokenize_output(path: str | Path) -> bool:
    """A directory a `tokenize` run writes: it holds its shards or its summary (and bookkeeping
    such as manifest.json, which is no data)."""
    path = Path(path)
    return path.is_dir() and bool(existing_shards(path) or (path / SUMMARY_NAME).exists())


def prepare_output_dir(output_dir: Path, overwrite: bool, resume: bool = False) -> list[str]:
    """Create the directory and return the shards to keep.

    An earlier run's shards are never mixed in silently: `resume` keeps them (their ids are then
    skipped), `overwrite` deletes them, and otherwise this refuses.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    shards = existing_shards(output_dir)
    summary = output_dir / SUMMARY_NAME
    for stale in sorted(output_dir.glob(".part-*.tmp")) + sorted(output_dir.glob(".part-*.staging")):
        stale.unlink()  # a shard that an interrupted run never renamed into place
    if resume:
        expected = [f"part-{index:05d}" for index in range(len(shards))]
        if [name.rsplit(".", 1)[0] for name in shards] != expected:
            raise InputError(f"{output_dir}: shards are not numbered 0..{len(shards) - 1}; cannot resume")
        return shards
    if (shards or summary.exists()) and not overwrite:
        raise InputError(
            f"{output_dir}: already holds tokenized shards ({len(shards)} files); pass --resume to "
            "continue, --overwrite to replace them, or choose another output directory"
        )
    for name in shards:
        (output_dir / name).unlink()
    summary.unlink(missing_ok=True)
    return []


def read_shard(path: str | Path) -> pa.Table:
    """One shard as a table (an Arrow shard memory-mapped; a Parquet one, from before Arrow, read)."""
    return pa.Table.from_batches(list(table_batches(Path(path), batch_size=1 << 30)))


def written_ids(output_dir: Path, shards: list[str]) -> set[str]:
    """Ids already in `shards` of `output_dir` (what a resumed run skips)."""
    ids: set[str] = set()
    for name in shards:
        for batch in table_batches(output_dir / name, ["id"]):
            ids.update(batch.column("id").to_pylist())
    return ids


class ShardWriter:
    """Buffers rows and writes `rows_per_shard` of them per Arrow shard, each one atomically.

    Rows are checked (the `check_batch` rules) when a shard is written. A shard is written to a
    hidden temporary file in the output directory and renamed into place, so a reader (or a crash)
    never sees a half-written ``part-NNNNN.arrow``.
    """

    def __init__(self, output_dir: Path, rows_per_shard: int = 10_000, existing: list[str] | None = None):
        if rows_per_shard < 1:
            raise InputError("rows per shard must be at least 1")
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.rows_per_shard = rows_per_shard
        self.shards: list[str] = list(existing or [])  # new shards are numbered after these
        self._ids: list[str] = []
        self._input_ids: list[np.ndarray] = []
        self._loss_masks: list[np.ndarray] = []
        self._finish_reasons: list[str | None] = []

    def add(self, row_id: str, input_ids: Any, loss_mask: Any, finish_reason: str | None = None) -> None:
        self._ids.append(row_id)
        self._input_ids.append(np.asarray(input_ids))
        self._loss_masks.append(np.asarray(loss_mask))
        self._finish_reasons.append(finish_reason)
        if len(self._ids) >= self.rows_per_shard:
            self.flush()

    def flush(self) -> None:
        if not self._ids:
            return
        checked = _check_rows(self._ids, self._input_ids, self._loss_masks)
        name = SHARD_PATTERN.format(index=len(self.shards))
        _write_shard(self.output_dir / name, checked, self._finish_reasons)
        self.shards.append(name)
        self._ids, self._input_ids, self._loss_masks, self._finish_reasons = [], [], [], []


def write_tokenized(rows: Iterable[dict[str, Any]], out_dir: str | Path, shard_rows: int = 10_000) -> list[Path]:
    """Write rows (``id``, ``input_ids``, ``loss_mask``, optional ``finish_reason``) as contract-2
    shards; returns their paths."""
    writer = ShardWriter(Path(out_dir), shard_rows)
    for row in rows:
        writer.add(row["id"], row["input_ids"], row["loss_mask"], row.get("finish_reason"))
    writer.flush()
    return [writer.output_dir / name for name in writer.shards]


# -- memory-mapped reading -------------------------------------------------------------------------


def _cache_root() -> Path:
    root = os.environ.get("DRAFTSMITH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "draftsmith"
    )
    return Path(root) / "tokenized"


def _native_stats(file: Path) -> dict[str, Any] | None:
    """The writer's stats of a draftsmith Arrow shard, or None for any other file."""
    if suffix_of(file) != ".arrow":
        return None
    try:
        with pa.memory_map(str(file), "r") as source:
            schema = pa.ipc.open_file(source).schema
    except (pa.ArrowInvalid, OSError):
        return None  # an Arrow stream (`datasets`) or not Arrow at all: the converter says which
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None or not schema.equals(SCHEMA, check_metadata=False):
        return None
    stats = json.loads(raw)
    return stats if stats.get("version") == FORMAT_VERSION else None


def _converted(file: Path) -> Path:
    """A memory-mappable copy of a foreign tokenized file, made once into the cache."""
    status = file.stat()
    key = hashlib.sha256(f"{file.resolve()}\0{status.st_size}\0{status.st_mtime_ns}\0v{FORMAT_VERSION}".encode())
    cached = _cache_root() / f"{key.hexdigest()[:32]}.arrow"
    if cached.exists() and _native_stats(cached) is not None:
        return cached
    print(
        f"{file}: not a draftsmith Arrow shard; checking and converting it once to a memory-mapped copy in "
        f"{cached} (`draftsmith tokenize` writes Arrow shards directly)",
        file=sys.stderr,
    )
    cached.parent.mkdir(parents=True, exist_ok=True)
    _require_columns(file, column_names(file))

    def batches() -> Iterator[tuple[CheckedBatch, list[str | None] | None]]:
        first_row = 0
        columns = [name for name in COLUMNS if name in column_names(file)]
        for batch in table_batches(file, columns, CONVERT_BATCH_ROWS):
            reasons = batch.column("finish_reason").to_pylist() if "finish_reason" in columns else None
            yield check_batch(file, first_row, batch), reasons
            first_row += batch.num_rows

    # Ranks converting the same file at once each write their own temporary name; the rename is atomic.
    private = cached.with_name(f"{cached.stem}.{os.getpid()}.arrow")
    stats = _write_streamed(private, batches())
    if stats["rows"] == 0:
        private.unlink(missing_ok=True)
        raise InputError(f"{file}: the tokenized file has no rows")
    os.replace(private, cached)
    return cached


@dataclass
class _Chunk:
    """One record batch of a mapped shard: its ids and offsets, and views of its flat values."""

    origin: Path  # the file the rows came from (before any conversion), for messages
    first_row: int  # within `origin`
    ids: pa.Array
    offsets: np.ndarray  # [rows + 1], into tokens / mask
    tokens: np.ndarray
    mask: np.ndarray
    num_trainable: np.ndarray
    map: mmap.mmap

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1

    def release(self) -> None:
        """Hand this chunk's resident pages back to the kernel; later reads fault them in again."""
        base = np.frombuffer(self.map, dtype=np.uint8, count=1).ctypes.data
        for view in (self.tokens, self.mask):
            if view.size:
                start = (view.ctypes.data - base) // mmap.PAGESIZE * mmap.PAGESIZE
                self.map.madvise(mmap.MADV_DONTNEED, start, view.ctypes.data - base + view.nbytes - start)


def _view(mapped: mmap.mmap, base: int, array: pa.Array, dtype) -> np.ndarray:
    """A writable (copy-on-write) numpy view of a primitive Arrow array that lives in `mapped`."""
    itemsize = np.dtype(dtype).itemsize
    address = array.buffers()[1].address + array.offset * itemsize
    return np.frombuffer(mapped, dtype=dtype, count=len(array), offset=address - base)


def _damaged(origin: Path, problem: str) -> InputError:
    return InputError(f"{origin}: a damaged tokenized shard ({problem}); write it again (draftsmith tokenize --overwrite)")


def _map_shard(path: Path, origin: Path) -> list[_Chunk]:
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    buffer = pa.py_buffer(mapped)
    try:
        reader = pa.ipc.open_file(buffer)
        batches = [reader.get_batch(index) for index in range(reader.num_record_batches)]
        for batch in batches:
            batch.validate()  # buffer sizes against the offsets: cheap, no pass over the values
    except (pa.ArrowInvalid, OSError) as error:
        raise _damaged(origin, str(error).splitlines()[0]) from None
    chunks, first_row = [], 0
    for batch in batches:
        tokens, mask = batch.column("input_ids"), batch.column("loss_mask")
        offsets = tokens.offsets.to_numpy()
        if not np.array_equal(offsets, mask.offsets.to_numpy()) or (np.diff(offsets) <= 0).any() or offsets[0] != 0:
            raise _damaged(origin, "input_ids and loss_mask rows differ")
        chunks.append(
            _Chunk(origin, first_row, batch.column("id"), offsets, _view(mapped, buffer.address, tokens.values, np.int32),
                   _view(mapped, buffer.address, mask.values, np.int8), batch.column("num_trainable").to_numpy(), mapped)  # fmt: skip
        )
        first_row += batch.num_rows
    return chunks


def _verified_marker(path: Path, stats: dict[str, Any]) -> Path:
    """Where a successful verification of `path` as it is now is remembered: keyed by the file's
    identity and change time (any write, copy or rename-over changes them) and its recorded sha256."""
    status = path.stat()
    key = f"{path.resolve()}\0{status.st_dev}\0{status.st_ino}\0{status.st_size}\0{status.st_mtime_ns}\0{status.st_ctime_ns}"
    digest = hashlib.sha256(f"{key}\0{stats.get('sha256')}".encode()).hexdigest()[:32]
    return _cache_root() / "verified" / digest


def _verify_shard(chunks: list[_Chunk], stats: dict[str, Any], origin: Path, mapped_path: Path) -> None:
    """Recompute what the shard's writer recorded (rows, tokens, trainable tokens, largest token id
    and the content's sha256) from the mapped pages, one chunk resident at a time, so a damaged
    byte is refused here, naming the file, and never reaches training as an out-of-range id.
    A file verified before and not changed since (same inode, size, mtime and ctime) is not
    hashed again: every rank, resume and eval would otherwise pay the pass."""
    marker = _verified_marker(mapped_path, stats)
    if marker.exists():
        return
    digest, counted = _ContentDigest(), _new_stats()
    for chunk in chunks:
        lengths = np.diff(chunk.offsets).astype(np.int64)
        ids = chunk.ids.to_pylist()
        if None in ids:
            raise _damaged(origin, "a row without an id")
        end = int(chunk.offsets[-1])
        _count(counted, digest, CheckedBatch(ids, lengths, chunk.tokens[:end], chunk.mask[:end]))
        if end and int(chunk.tokens[:end].min()) < 0:
            raise _damaged(origin, "a negative token id")
        chunk.release()
    counted["sha256"] = digest.hexdigest()
    for key in ("rows", "tokens", "trainable", "max_token_id", "sha256"):
        if counted[key] != stats.get(key):
            raise _damaged(origin, f"its {key} is {counted[key]}, its writer recorded {stats.get(key)}")
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass  # a read-only cache only means verifying again next time


class TokenizedDataset(Sequence):
    """The samples of memory-mapped shards, in order: ``dataset[i]`` is a `TokenizedSample` made on
    access (truncated to `max_length`); aggregates are computed over the offsets, not per sample.

    A full pass (``for sample in dataset``) hands each chunk's pages back to the kernel once it has
    moved past it, so resident memory stays at about one shard whatever the sample count.
    """

    def __init__(self, chunks: list[_Chunk], source: Path, max_length: int | None, shard_stats: list[dict[str, Any]]):
        self._chunks = chunks
        self._starts = np.cumsum([0] + [chunk.rows for chunk in chunks])
        self.source = source
        self.max_length = max_length
        self.shard_stats = shard_stats

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _sample(self, chunk: _Chunk, row: int) -> TokenizedSample:
        start, end = int(chunk.offsets[row]), int(chunk.offsets[row + 1])
        if self.max_length is not None:
            end = min(end, start + self.max_length)
        return TokenizedSample(chunk.ids[row].as_py(), chunk.tokens[start:end], chunk.mask[start:end])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[position] for position in range(*index.indices(len(self)))]
        index = operator.index(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        number = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self._sample(self._chunks[number], index - int(self._starts[number]))

    def __iter__(self) -> Iterator[TokenizedSample]:
        for chunk in self._chunks:
            for row in range(chunk.rows):
                yield self._sample(chunk, row)
            chunk.release()

    @property
    def samples(self) -> TokenizedDataset:
        """The dataset itself, a lazy sequence of samples (kept for callers written for a list)."""
        return self

    @cached_property
    def lengths(self) -> np.ndarray:
        """Tokens per sample after truncation, int64 [len(self)]."""
        lengths = np.concatenate([np.diff(chunk.offsets).astype(np.int64) for chunk in self._chunks])
        return lengths if self.max_length is None else np.minimum(lengths, self.max_length)

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    @cached_property
    def trainable_counts(self) -> np.ndarray:
        """Trainable (loss-mask) tokens per sample after truncation, int64 [len(self)]: the writer's
        counts, recounted over the kept part only for the rows `max_length` cuts."""
        counts = []
        for chunk in self._chunks:
            stored = chunk.num_trainable.astype(np.int64)
            cut = np.flatnonzero(np.diff(chunk.offsets) > self.max_length) if self.max_length is not None else []
            if len(cut):
                starts = chunk.offsets[cut].astype(np.int64)
                for rows, base, stop in _windows(starts, starts + self.max_length):
                    running = np.zeros(stop - base + 1, dtype=np.int64)
                    np.cumsum(chunk.mask[base:stop], dtype=np.int64, out=running[1:])
                    stored[cut[rows]] = running[starts[rows] + self.max_length - base] - running[starts[rows] - base]
                chunk.release()
            counts.append(stored)
        return np.concatenate(counts)

    @property
    def total_trainable(self) -> int:
        return int(self.trainable_counts.sum())

    @property
    def max_token_id(self) -> int:
        """The largest token id the shards hold (counted by their writer, before truncation)."""
        return max(int(stats["max_token_id"]) for stats in self.shard_stats)

    def trainable_pairs(self) -> np.ndarray:
        """Per sample (after truncation), the positions t with loss_mask[t] == loss_mask[t+1] == 1:
        a sample without one has no position a draft block can start from. Vectorised over
        windows of a few million tokens, one chunk of pages resident at a time."""
        counts = []
        for chunk in self._chunks:
            starts = chunk.offsets[:-1].astype(np.int64)
            ends = chunk.offsets[1:].astype(np.int64)
            if self.max_length is not None:
                ends = np.minimum(ends, starts + self.max_length)
            result = np.zeros(chunk.rows, dtype=np.int64)
            for rows, base, stop in _windows(starts, ends):
                trained = chunk.mask[base:stop].view(np.bool_)  # checked 0/1 by the writer
                running = np.zeros(stop - base, dtype=np.int64)
                np.cumsum(trained[:-1] & trained[1:], dtype=np.int64, out=running[1:])
                result[rows] = running[ends[rows] - 1 - base] - running[starts[rows] - base]
            chunk.release()
            counts.append(result)
        return np.concatenate(counts)

    def fingerprint(self) -> str:
        """A digest of the content: each shard's writer-computed sha256 (ids, token ids, masks) and
        the lengths after truncation. Data rewritten at the same path changes it; it costs a
        hash of 8 bytes per sample, not a pass over the tokens."""
        digest = hashlib.sha256(f"draftsmith.tokenized.v{FORMAT_VERSION}".encode())
        for stats in self.shard_stats:
            digest.update(stats["sha256"].encode() + b"\0")
        digest.update(self.lengths.astype("<i8").tobytes())
        return digest.hexdigest()[:32]


def _windows(starts: np.ndarray, ends: np.ndarray, tokens: int = 1 << 22) -> Iterator[tuple[slice, int, int]]:
    """(rows, first token, end token) windows over sorted, non-overlapping segments [start, end),
    each spanning about `tokens` tokens (at least one row), so a scan's temporaries stay small."""
    row = 0
    while row < len(starts):
        base = int(starts[row])
        last = max(row + 1, int(np.searchsorted(ends, base + tokens, side="right")))
        yield slice(row, last), base, int(ends[last - 1])
        row = last


def _check_unique_ids(chunks: list[_Chunk]) -> None:
    ids = pa.chunked_array([chunk.ids for chunk in chunks], type=pa.string())
    if pc.count_distinct(ids).as_py() == len(ids):
        return
    seen: dict[str, str] = {}
    for chunk in chunks:
        for row, sample_id in enumerate(chunk.ids.to_pylist()):
            where = f"{chunk.origin}: row {chunk.first_row + row} (id {sample_id})"
            if sample_id in seen:
                raise InputError(f"{where}: duplicate id, first seen in {seen[sample_id]}")
            seen[sample_id] = where


def load_tokenized(path: str | Path, max_length: int | None = None, split: str | None = None) -> TokenizedDataset:
    """Memory-map and check a tokenized dataset; sequences longer than `max_length` are truncated."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: tokenized dataset not found")
    if max_length is not None and max_length < 1:
        raise InputError(f"max_length must be at least 1, not {max_length}")
    chunks, shard_stats = [], []
    for file in tokenized_files(path, split):
        stats = _native_stats(file)
        mapped = file if stats is not None else _converted(file)
        if stats is None:
            stats = _native_stats(mapped)
        if stats["rows"] == 0:
            continue
        shard_chunks = _map_shard(mapped, file)
        _verify_shard(shard_chunks, stats, file, mapped)
        chunks.extend(shard_chunks)
        shard_stats.append(stats)
    if not chunks:
        raise InputError(f"{path}: the tokenized dataset has no rows")
    _check_unique_ids(chunks)
    return TokenizedDataset(chunks, path, max_length, shard_stats)
