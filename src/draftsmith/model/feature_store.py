"""The read side of a features directory (`draftsmith extract` writes it; offline training reads it).

Layout:
  index.json                      what was extracted and from what (target, layers, dtype, data
                                  fingerprint, max_length) and the list of finished shards
  features-00000.safetensors      `features` [tokens, k*H] (the raw concatenation of the k captured
                                  layers, as the drafter's `fc` expects), `offsets` [n+1] int64 row
                                  starts of each sample, `input_ids` [tokens] int32 for verification
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.core.config import torch_dtype
from draftsmith.core.errors import InputError
from draftsmith.data.tokenized import TokenizedDataset

INDEX_NAME = "index.json"
FEATURES_KIND = "draftsmith.features"
FEATURES_VERSION = 1


class FeatureStore:
    """Read-side of a features directory: the captured features of sample i, checked against its data."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index_path = self.path / INDEX_NAME
        if not index_path.exists():
            raise InputError(f"{self.path}: no {INDEX_NAME}; create it with `draftsmith extract`")
        self.index = json.loads(index_path.read_text())
        if self.index.get("kind") != FEATURES_KIND:
            raise InputError(f"{index_path}: not a draftsmith features index")
        if not self.index.get("complete"):
            raise InputError(f"{index_path}: extraction is incomplete; rerun `draftsmith extract` to finish it")
        self.layer_ids: list[int] = list(self.index["layer_ids"])
        # Absent in directories extracted before the definition; only the last layer differs then.
        self.feature_definition: str | None = self.index.get("feature_definition")
        self.dtype = torch_dtype(self.index["dtype"])
        self._shards = sorted(self.index["shards"], key=lambda shard: shard["first"])
        self._open: dict[str, tuple[object, torch.Tensor]] = {}

    def check_matches(self, dataset: TokenizedDataset, max_length: int) -> None:
        problems = []
        if self.index["num_samples"] != len(dataset):
            problems.append(f"{self.index['num_samples']} samples vs {len(dataset)} in the data")
        if self.index["max_length"] != max_length:
            problems.append(f"max_length {self.index['max_length']} vs {max_length}")
        if not problems and self.index["data_fingerprint"] != dataset.fingerprint():
            problems.append("the token ids / loss masks differ")
        if problems:
            raise InputError(
                f"{self.path}: features do not match the training data {dataset.source}: "
                + "; ".join(problems)
                + " (re-extract for this data)"
            )

    def _shard_for(self, index: int) -> dict:
        for shard in self._shards:
            if shard["first"] <= index < shard["first"] + shard["count"]:
                return shard
        raise InputError(f"{self.path}: no shard holds sample {index}")

    def get(self, index: int, sample_id: str | None = None) -> torch.Tensor:
        """Features [T, k*H] of sample `index` (in the stored dtype)."""
        from safetensors import safe_open

        shard = self._shard_for(index)
        if shard["file"] not in self._open:
            if len(self._open) >= 8:
                self._open.pop(next(iter(self._open)))
            # Shards can be many GB: keep them memory-mapped and read only the rows asked for.
            handle = safe_open(str(self.path / shard["file"]), framework="pt")
            self._open[shard["file"]] = (handle, handle.get_tensor("offsets"))
        handle, offsets = self._open[shard["file"]]
        row = index - shard["first"]
        if sample_id is not None and shard["ids"][row] != sample_id:
            raise InputError(f"{self.path / shard['file']}: row {row} is {shard['ids'][row]}, expected {sample_id}")
        return handle.get_slice("features")[int(offsets[row]) : int(offsets[row + 1])]
