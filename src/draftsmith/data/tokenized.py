"""Data contract 2, tokenized rows: one streaming reader and one atomic shard writer.

A tokenized dataset is a directory of Parquet shards ``part-00000.parquet``, ... with the columns of
`SCHEMA`, plus ``tokenize_summary.json`` written last. Readers also accept one Parquet file, Arrow
IPC files, `datasets.save_to_disk` directories (one split, by the `data.sources` rule) and folders
of them. Rows keep the order of the files (sorted by name) and of the rows inside them: offline
features are addressed by that order and by id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.core.errors import InputError
from draftsmith.core.io import atomic_path
from draftsmith.data.sources import TABLE_SUFFIXES, column_names, resolve, table_batches

SHARD_PATTERN = "part-{index:05d}.parquet"
SUMMARY_NAME = "tokenize_summary.json"
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


# -- reading ---------------------------------------------------------------------------------------


def tokenized_files(path: str | Path | Iterable[str | Path], split: str | None = None) -> list[Path]:
    """The Parquet/Arrow files of a tokenized dataset (see the module docstring)."""
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
class TokenizedSample:
    """One training sequence: token ids and the 0/1 mask of response (trainable) tokens."""

    id: str
    input_ids: np.ndarray  # int64 [T]
    loss_mask: np.ndarray  # int8 [T]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_trainable(self) -> int:
        return int(self.loss_mask.sum())


def iter_tokenized(path: str | Path | Iterable[str | Path], split: str | None = None) -> Iterator[TokenizedSample]:
    """Checked samples, streaming; a bad row raises `InputError` naming file, row and id."""
    seen: dict[str, str] = {}
    current, offset = None, 0
    for file, batch in iter_tokenized_batches(path, split=split):
        if file != current:
            current, offset = file, 0
        ids = batch.column("id").to_pylist() if "id" in batch.schema.names else [None] * batch.num_rows
        for index, (tokens, mask) in enumerate(
            zip(batch.column("input_ids").to_pylist(), batch.column("loss_mask").to_pylist(), strict=True)
        ):
            row = offset + index
            sample_id = str(ids[index]) if ids[index] is not None else f"{file.name}:{row}"
            where = f"{file}: row {row} (id {sample_id})"
            if tokens is None or mask is None or len(tokens) == 0:
                raise InputError(f"{where}: empty input_ids or loss_mask")
            if len(tokens) != len(mask):
                raise InputError(f"{where}: input_ids has {len(tokens)} tokens but loss_mask has {len(mask)}")
            token_array = np.asarray(tokens, dtype=np.int64)
            mask_array = np.asarray(mask, dtype=np.int8)
            if token_array.min() < 0:
                raise InputError(f"{where}: negative token id {int(token_array.min())}")
            valid = np.isin(mask_array, (0, 1))
            if not valid.all():
                raise InputError(f"{where}: loss_mask must be 0/1, found {int(mask_array[~valid][0])}")
            if sample_id in seen:
                raise InputError(f"{where}: duplicate id, first seen in {seen[sample_id]}")
            seen[sample_id] = where
            yield TokenizedSample(sample_id, token_array, mask_array)
        offset += batch.num_rows


@dataclass
class TokenizedDataset:
    samples: list[TokenizedSample]
    source: Path

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> TokenizedSample:
        return self.samples[index]

    @property
    def total_tokens(self) -> int:
        return sum(sample.num_tokens for sample in self.samples)

    @property
    def total_trainable(self) -> int:
        return sum(sample.num_trainable for sample in self.samples)

    def fingerprint(self) -> str:
        """A digest of ids and token ids, so offline features can be matched to their data."""
        digest = hashlib.sha256()
        for sample in self.samples:
            digest.update(sample.id.encode())
            digest.update(b"\0")
            digest.update(sample.input_ids.astype(np.int64).tobytes())
            digest.update(sample.loss_mask.astype(np.int8).tobytes())
        return digest.hexdigest()[:32]


def load_tokenized(path: str | Path, max_length: int | None = None, split: str | None = None) -> TokenizedDataset:
    """Load and validate a tokenized dataset; sequences longer than `max_length` are truncated."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: tokenized dataset not found")
    samples = []
    for sample in iter_tokenized(path, split):
        if max_length is not None and sample.num_tokens > max_length:
            sample = TokenizedSample(sample.id, sample.input_ids[:max_length], sample.loss_mask[:max_length])
        samples.append(sample)
    if not samples:
        raise InputError(f"{path}: the tokenized dataset has no rows")
    return TokenizedDataset(samples=samples, source=path)


def written_ids(output_dir: Path, shards: list[str]) -> set[str]:
    """Ids already in `shards` of `output_dir` (what a resumed run skips)."""
    ids: set[str] = set()
    for name in shards:
        ids.update(pq.read_table(output_dir / name, columns=["id"]).column("id").to_pylist())
    return ids


# -- writing ---------------------------------------------------------------------------------------


def _list_array(values: list[np.ndarray], dtype) -> pa.Array:
    lengths = np.fromiter((len(item) for item in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(values).astype(dtype, copy=False) if values else np.zeros(0, dtype=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def prepare_output_dir(output_dir: Path, overwrite: bool, resume: bool = False) -> list[str]:
    """Create the directory and return the shards to keep.

    An earlier run's shards are never mixed in silently: `resume` keeps them (their ids are then
    skipped), `overwrite` deletes them, and otherwise this refuses.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    shards = sorted(path.name for path in output_dir.glob("part-*.parquet"))
    summary = output_dir / SUMMARY_NAME
    for stale in sorted(output_dir.glob(".part-*.parquet.tmp")):
        stale.unlink()  # a shard that an interrupted run never renamed into place
    if resume:
        expected = [SHARD_PATTERN.format(index=index) for index in range(len(shards))]
        if shards != expected:
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


class ShardWriter:
    """Buffers rows and writes `rows_per_shard` of them per Parquet shard, each one atomically.

    A shard is written to a hidden temporary file in the output directory and renamed into place,
    so a reader (or a crash) never sees a half-written ``part-NNNNN.parquet``.
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
        num_tokens = np.fromiter((len(item) for item in self._input_ids), dtype=np.int32)
        num_trainable = np.fromiter((int(item.sum()) for item in self._loss_masks), dtype=np.int32)
        table = pa.Table.from_arrays(
            [
                pa.array(self._ids, type=pa.string()),
                _list_array(self._input_ids, np.int32),
                _list_array(self._loss_masks, np.int8),
                pa.array(num_tokens),
                pa.array(num_trainable),
                pa.array(self._finish_reasons, type=pa.string()),
            ],
            schema=SCHEMA,
        )
        name = SHARD_PATTERN.format(index=len(self.shards))
        with atomic_path(self.output_dir / name) as temporary:
            pq.write_table(table, temporary, compression="zstd")
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
