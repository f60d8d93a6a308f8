"""Reading the tokenized dataset (contract 2) for training, and a local regeneration helper.

A tokenized dataset is a directory of Parquet shards `part-00000.parquet`, ... with columns `id`,
`input_ids` (list<int32>) and `loss_mask` (list<int8>). A single Parquet file, Arrow IPC files and
`datasets.save_to_disk` directories are accepted too. Samples keep the order of the shards (sorted by
name) and of the rows inside them: offline features are addressed by that order and by id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftsmith.core.errors import InputError
from draftsmith.core.io import atomic_path


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


def _tables_from_path(path: Path) -> list[tuple[str, Any]]:
    """Return (label, pyarrow.Table) pairs in a stable order."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    def read_arrow(file: Path):
        try:
            with pa.memory_map(str(file)) as source:
                return ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            with pa.memory_map(str(file)) as source:
                return ipc.open_stream(source).read_all()

    def read_file(file: Path):
        try:
            if file.suffix == ".parquet":
                return pq.read_table(file)
            return read_arrow(file)
        except (OSError, pa.ArrowException) as error:
            raise InputError(f"{file}: cannot read as {file.suffix.lstrip('.')}: {error}") from error

    if not path.exists():
        raise InputError(f"{path}: tokenized dataset not found")
    if path.is_file():
        if path.suffix not in {".parquet", ".arrow"}:
            raise InputError(f"{path}: expected a .parquet or .arrow file or a directory of them")
        return [(str(path), read_file(path))]
    if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise InputError(f"{path}: dataset dict has no 'train' split ({list(loaded)})")
            loaded = loaded["train"]
        return [(str(path), loaded.data.table)]
    files = sorted(path.glob("*.parquet")) or sorted(path.glob("*.arrow"))
    if not files:
        raise InputError(f"{path}: no Parquet or Arrow shards in this directory")
    return [(str(file), read_file(file)) for file in files]


def load_tokenized(path: str | Path, max_length: int | None = None) -> TokenizedDataset:
    """Load and validate a tokenized dataset; sequences longer than `max_length` are truncated."""
    path = Path(path)
    samples: list[TokenizedSample] = []
    seen: dict[str, str] = {}
    for label, table in _tables_from_path(path):
        missing = [name for name in ("input_ids", "loss_mask") if name not in table.column_names]
        if missing:
            raise InputError(f"{label}: missing column(s) {', '.join(missing)} (have {table.column_names})")
        ids = table.column("id").to_pylist() if "id" in table.column_names else None
        input_ids = table.column("input_ids").to_pylist()
        loss_masks = table.column("loss_mask").to_pylist()
        for row, (tokens, mask) in enumerate(zip(input_ids, loss_masks, strict=True)):
            sample_id = str(ids[row]) if ids is not None and ids[row] is not None else f"{Path(label).name}:{row}"
            where = f"{label}: row {row} (id {sample_id})"
            if tokens is None or mask is None or len(tokens) == 0:
                raise InputError(f"{where}: empty input_ids or loss_mask")
            if len(tokens) != len(mask):
                raise InputError(f"{where}: input_ids has {len(tokens)} tokens but loss_mask has {len(mask)}")
            token_array = np.asarray(tokens, dtype=np.int64)
            mask_array = np.asarray(mask, dtype=np.int8)
            if token_array.min() < 0:
                raise InputError(f"{where}: negative token id {int(token_array.min())}")
            if not np.isin(mask_array, (0, 1)).all():
                bad = int(mask_array[~np.isin(mask_array, (0, 1))][0])
                raise InputError(f"{where}: loss_mask must be 0/1, found {bad}")
            if sample_id in seen:
                raise InputError(f"{where}: duplicate id, first seen in {seen[sample_id]}")
            seen[sample_id] = where
            if max_length is not None and token_array.shape[0] > max_length:
                token_array = token_array[:max_length]
                mask_array = mask_array[:max_length]
            samples.append(TokenizedSample(sample_id, token_array, mask_array))
    if not samples:
        raise InputError(f"{path}: the tokenized dataset has no rows")
    return TokenizedDataset(samples=samples, source=path)


def check_vocabulary(dataset: TokenizedDataset, vocab_size: int) -> None:
    for index, sample in enumerate(dataset.samples):
        top = int(sample.input_ids.max())
        if top >= vocab_size:
            raise InputError(
                f"{dataset.source}: sample {index} (id {sample.id}) has token id {top}, "
                f"outside the target's vocabulary of {vocab_size}"
            )


def write_tokenized(rows: Iterable[dict[str, Any]], out_dir: str | Path, shard_rows: int = 10_000) -> list[Path]:
    """Write contract-2 Parquet shards (`part-00000.parquet`, ...) atomically; returns their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftsmith.tokenize.writer import SCHEMA, SHARD_PATTERN

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    buffer: list[dict[str, Any]] = []

    def flush() -> None:
        if not buffer:
            return
        columns = {
            "id": [row["id"] for row in buffer],
            "input_ids": [list(map(int, row["input_ids"])) for row in buffer],
            "loss_mask": [list(map(int, row["loss_mask"])) for row in buffer],
            "num_tokens": [len(row["input_ids"]) for row in buffer],
            "num_trainable": [int(sum(row["loss_mask"])) for row in buffer],
            "finish_reason": [row.get("finish_reason") for row in buffer],
        }
        target = out_dir / SHARD_PATTERN.format(index=len(written))
        with atomic_path(target) as partial:
            pq.write_table(pa.table(columns, schema=SCHEMA), partial)
        written.append(target)
        buffer.clear()

    for row in rows:
        buffer.append(row)
        if len(buffer) >= shard_rows:
            flush()
    flush()
    return written


def regenerate_locally(
    target_dir: str | Path,
    prompts: Iterable[dict[str, Any]],
    out_dir: str | Path,
    max_new_tokens: int = 160,
    batch_size: int = 32,
    enable_thinking: bool | None = None,
) -> TokenizedDataset:
    """Regenerate responses with a local HF target (greedy) and write a tokenized dataset.

    Prompt tokens get loss-mask 0 and generated tokens (up to and including the end-of-turn token)
    1: the target's own greedy output is what the drafter must learn to predict. This is the small,
    in-process version of generate + tokenize, used for the tiny default and tests.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    model.eval()
    eos_ids = model.generation_config.eos_token_id
    eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids if eos_ids is not None else tokenizer.eos_token_id])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids))

    prompt_rows = list(prompts)
    template_kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    encoded: list[tuple[str, list[int]]] = []
    for index, row in enumerate(prompt_rows):
        if "messages" not in row:
            raise InputError(f"prompt {index} (id {row.get('id')}): no 'messages' field")
        ids = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True, **template_kwargs)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        encoded.append((str(row.get("id", index)), list(ids)))

    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start : start + batch_size]
            width = max(len(ids) for _, ids in chunk)
            batch = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row_index, (_, ids) in enumerate(chunk):
                batch[row_index, width - len(ids) :] = torch.tensor(ids)
                attention[row_index, width - len(ids) :] = 1
            output = model.generate(
                input_ids=batch,
                attention_mask=attention,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=sorted(eos_ids),
            )
            for row_index, (sample_id, ids) in enumerate(chunk):
                generated: list[int] = []
                finish = "length"
                for token in output[row_index, width:].tolist():
                    generated.append(token)
                    if token in eos_ids:
                        finish = "stop"
                        break
                rows.append(
                    {
                        "id": sample_id,
                        "input_ids": ids + generated,
                        "loss_mask": [0] * len(ids) + [1] * len(generated),
                        "finish_reason": finish,
                    }
                )
    write_tokenized(rows, out_dir)
    return load_tokenized(out_dir)


def iter_batches(indices: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    for start in range(0, len(indices), batch_size):
        yield list(indices[start : start + batch_size])
