"""Write tokenized rows (data contract 2) as Parquet shards, each one atomically.

A shard is written to a hidden temporary file in the output directory and renamed into place, so
a reader (or a crash) never sees a half-written `part-NNNNN.parquet`. The summary JSON is written
the same way, last: a directory without it is an unfinished run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.core.errors import InputError
from draftsmith.core.io import atomic_path

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


def written_ids(output_dir: Path, shards: list[str]) -> set[str]:
    ids: set[str] = set()
    for name in shards:
        ids.update(pq.read_table(output_dir / name, columns=["id"]).column("id").to_pylist())
    return ids


class ShardWriter:
    """Buffers rows and writes `rows_per_shard` of them per Parquet shard."""

    def __init__(self, output_dir: Path, rows_per_shard: int = 10_000, existing: list[str] | None = None):
        if rows_per_shard < 1:
            raise InputError("rows per shard must be at least 1")
        self.output_dir = output_dir
        self.rows_per_shard = rows_per_shard
        self.shards: list[str] = list(existing or [])  # new shards are numbered after these
        self._ids: list[str] = []
        self._input_ids: list[np.ndarray] = []
        self._loss_masks: list[np.ndarray] = []
        self._finish_reasons: list[str | None] = []

    def add(self, row_id: str, input_ids: np.ndarray, loss_mask: np.ndarray, finish_reason: str | None) -> None:
        self._ids.append(row_id)
        self._input_ids.append(input_ids)
        self._loss_masks.append(loss_mask)
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
