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
        self._open: dict[str, tuple[object, torch.Tensor, torch.Tensor]] = {}

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

    def _open_shard(self, shard: dict) -> tuple[object, torch.Tensor, torch.Tensor]:
        """A shard's handle, offsets and token ids, after checking them against its index entry
        (a cheap look at shapes, no pass over the features): a shard that does not hold what the
        index says is refused naming it, never sliced into short or empty rows mid-epoch."""
        from safetensors import safe_open

        from draftsmith.model.safetensors_file import read_safetensors_header

        path = self.path / shard["file"]
        read_safetensors_header(path)  # offsets and sizes first, as on every path that reads safetensors
        handle = safe_open(str(path), framework="pt")
        offsets, input_ids = handle.get_tensor("offsets"), handle.get_tensor("input_ids")
        features = handle.get_slice("features")
        rows, width = (list(features.get_shape()) + [0, 0])[:2]
        problems = []
        if tuple(offsets.shape) != (shard["count"] + 1,):
            problems.append(f"{tuple(offsets.shape)[0] - 1 if offsets.dim() == 1 else '?'} row offsets, its index entry says {shard['count']} rows")
        elif int(offsets[0]) != 0 or bool((offsets[1:] <= offsets[:-1]).any()) or int(offsets[-1]) != rows:
            problems.append(f"row offsets that do not cut its {rows} feature rows")
        if tuple(input_ids.shape) != (rows,):
            problems.append(f"{tuple(input_ids.shape)} token ids for {rows} feature rows")
        expected_width = self.index.get("feature_dim")
        if expected_width is not None and width != expected_width:
            problems.append(f"features {width} wide, the index says {expected_width}")
        if problems:
            raise InputError(f"{path}: a damaged features shard ({'; '.join(problems)}); re-extract it")
        return handle, offsets, input_ids

    def get(self, index: int, sample_id: str | None = None, input_ids=None) -> torch.Tensor:
        """Features [T, k*H] of sample `index` (in the stored dtype); with `input_ids` (the sample's
        tokens), the tokens the features were extracted from must be those."""
        shard = self._shard_for(index)
        if shard["file"] not in self._open:
            if len(self._open) >= 8:
                self._open.pop(next(iter(self._open)))
            # Shards can be many GB: keep them memory-mapped and read only the rows asked for.
            self._open[shard["file"]] = self._open_shard(shard)
        handle, offsets, stored_ids = self._open[shard["file"]]
        row = index - shard["first"]
        if sample_id is not None and shard["ids"][row] != sample_id:
            raise InputError(f"{self.path / shard['file']}: row {row} is {shard['ids'][row]}, expected {sample_id}")
        start, end = int(offsets[row]), int(offsets[row + 1])
        if input_ids is not None and not torch.equal(stored_ids[start:end].long(), torch.as_tensor(input_ids).long()):
            raise InputError(
                f"{self.path / shard['file']}: row {row} (id {shard['ids'][row]}) holds features of other tokens "
                f"than the training data's sample {index}; re-extract for this data"
            )
        return handle.get_slice("features")[start:end]
