"""`draftsmith extract`: dump the target's hidden-state features for offline training.

Layout of a features directory:
  index.json                      what was extracted and from what (target, layers, dtype, data
                                  fingerprint, max_length) and the list of finished shards
  features-00000.safetensors      `features` [tokens, k*H] (the raw concatenation of the k captured
                                  layers, as the drafter's `fc` expects), `offsets` [n+1] int64 row
                                  starts of each sample, `input_ids` [tokens] int32 for verification
Shards are written to a temporary name and renamed, and the index is rewritten atomically after each
shard, so an interrupted extract resumes at the first missing shard and never duplicates work.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.core.errors import InputError
from draftsmith.core.io import atomic_path, write_json_atomic
from draftsmith.core.lock import lock_directory
from draftsmith.core.manifest import check_manifest, require_complete, tokenizer_fingerprint
from draftsmith.core.progress import Progress
from draftsmith.data.tokenized import TokenizedDataset, load_tokenized
from draftsmith.model.config import FEATURE_DEFINITION
from draftsmith.train.config import ExtractConfig
from draftsmith.train.data import check_vocabulary

INDEX_NAME = "index.json"
FEATURES_KIND = "draftsmith.features"
FEATURES_VERSION = 1
SHARD_TARGET_BYTES = 1 << 30
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_layer_ids(target_config, num_features: int, target_layer_ids: list[int] | None) -> list[int]:
    """The captured target layers: explicit ones, else the model's default rule (shared with train)."""
    from draftsmith.model import default_target_layer_ids

    num_layers = int(target_config.get_text_config().num_hidden_layers)
    layer_ids = list(target_layer_ids) if target_layer_ids else default_target_layer_ids(num_layers, num_features)
    bad = [layer for layer in layer_ids if not 0 <= layer < num_layers]
    if bad:
        raise InputError(f"target layer ids {bad} outside the target's layers 0..{num_layers - 1}")
    return layer_ids


def mask_token_id_for(target_dir: Path) -> int:
    from transformers import AutoTokenizer

    from draftsmith.model import mask_token_id

    token_id = mask_token_id(AutoTokenizer.from_pretrained(target_dir))
    if token_id is None:
        raise InputError(
            f"{target_dir}: the tokenizer has no <|MASK|> token; add one (DFlash blocks are "
            "[anchor, MASK x (B-1)], see draftsmith.model.ensure_mask_token) or pass --mask-token-id"
        )
    return token_id


@dataclass
class ExtractResult:
    out_dir: Path
    num_samples: int
    total_tokens: int
    layer_ids: list[int]
    bytes_written: int
    shards: int
    skipped_shards: int
    elapsed_s: float
    estimate_summary: str = ""
    extra: dict = field(default_factory=dict)


def storage_estimate(hidden_size: int, num_layers: int, dataset: TokenizedDataset, dtype: str, out_dir: Path):
    from draftsmith.model.storage import estimate_hidden_state_storage

    probe = out_dir if out_dir.exists() else next((p for p in out_dir.parents if p.exists()), Path("/"))
    return estimate_hidden_state_storage(
        hidden_size=hidden_size,
        num_captured_layers=num_layers,
        total_tokens=dataset.total_tokens,
        num_samples=len(dataset),
        dtype=dtype,
        disk_bytes=shutil.disk_usage(probe).free,
    )


def extract_features(
    target: str | Path,
    data: str | Path,
    out: str | Path,
    *,
    num_features: int = 5,
    target_layer_ids: list[int] | None = None,
    dtype: str = "bfloat16",
    max_length: int = 3072,
    batch_size: int = 8,
    samples_per_shard: int | None = None,
    device: str = "auto",
    force: bool = False,
    progress: bool = True,
    echo=print,
) -> ExtractResult:
    """Run the target over every sample and write its captured-layer features to shards."""
    started = time.perf_counter()
    # One validation of the settings (dtype spellings, bounds) for the CLI and the Python API alike.
    settings = ExtractConfig(
        target=target, data=data, out=out, num_features=num_features, target_layer_ids=target_layer_ids,
        dtype=dtype, max_length=max_length, batch_size=batch_size, samples_per_shard=samples_per_shard,
        device=device, force=force, progress=progress,
    )
    with lock_directory(settings.out, "extract"):
        return _extract(settings, started, echo)


def _extract(settings: ExtractConfig, started: float, echo) -> ExtractResult:
    from draftsmith.model import extract_target_features
    from draftsmith.train.distributed import resolve_device
    from draftsmith.model.target import load_target_config, load_target_model, weight_files

    target, out, dtype = settings.target, settings.out, settings.dtype
    data, num_features, target_layer_ids = settings.data, settings.num_features, settings.target_layer_ids
    max_length, batch_size, samples_per_shard = settings.max_length, settings.batch_size, settings.samples_per_shard
    device, force, progress = settings.device, settings.force, settings.progress
    target_config = load_target_config(target)
    weight_files(target)  # a truncated or corrupt download is named before the data is read
    require_complete(data, "the tokenized set", "rerun `draftsmith tokenize --resume` to finish it")
    dataset = load_tokenized(data, max_length=max_length)
    check_vocabulary(dataset, target_config.vocab_size)
    layer_ids = resolve_layer_ids(target_config, num_features, target_layer_ids)
    hidden_size = int(target_config.get_text_config().hidden_size)

    estimate = storage_estimate(hidden_size, len(layer_ids), dataset, dtype, out)
    summary = estimate.summary()
    echo(summary)
    free = shutil.disk_usage(out if out.exists() else next(p for p in out.parents if p.exists())).free
    if estimate.total_bytes > free and not force:
        raise InputError(
            f"{out}: the features need about {estimate.total_bytes / 1e9:.2f} GB but only "
            f"{free / 1e9:.2f} GB are free; train online (no --offline) or pass --force"
        )

    if samples_per_shard is None:
        # About 1 GiB per shard: large enough to keep the file count sane, small enough to hold in RAM
        # while it is written.
        samples_per_shard = int(min(10_000, max(1, SHARD_TARGET_BYTES // max(1.0, estimate.bytes_per_sample))))
    header = {
        "kind": FEATURES_KIND,
        "version": FEATURES_VERSION,
        "target": str(target.resolve()),
        "layer_ids": layer_ids,
        "feature_definition": FEATURE_DEFINITION,
        "hidden_size": hidden_size,
        "feature_dim": hidden_size * len(layer_ids),
        "dtype": dtype,
        "max_length": max_length,
        "data": str(Path(data).resolve()),
        "data_fingerprint": dataset.fingerprint(),
        "num_samples": len(dataset),
        "total_tokens": dataset.total_tokens,
        "samples_per_shard": samples_per_shard,
    }
    # The settings that change the features; a resume with others would mix two extractions.
    check_manifest(out, "extract", {
        "target": tokenizer_fingerprint(target), "data_fingerprint": header["data_fingerprint"],
        "layer_ids": layer_ids, "feature_definition": FEATURE_DEFINITION, "dtype": dtype, "max_length": max_length,
    }, force_flag=None)  # features of two settings in one directory are never usable: no --force-resume
    index_path = out / INDEX_NAME
    shards: list[dict] = []
    if index_path.exists():
        previous = json.loads(index_path.read_text())
        mismatched = [key for key in header if key not in ("target", "data") and previous.get(key) != header[key]]
        if mismatched:
            raise InputError(
                f"{index_path}: existing features were extracted with different "
                f"{', '.join(mismatched)}; extract into a new directory"
            )
        shards = [shard for shard in previous.get("shards", []) if (out / shard["file"]).exists()]
    done = {shard["first"] for shard in shards}

    target_dtype = DTYPES[dtype] if torch.device(resolve_device(device)).type == "cuda" else torch.float32
    model = None
    total_shards = (len(dataset) + samples_per_shard - 1) // samples_per_shard
    bytes_written = 0
    skipped = 0

    with Progress("extract", len(dataset), unit="samples", enabled=progress) as bar:
        for shard_number in range(total_shards):
            first = shard_number * samples_per_shard
            samples = dataset.samples[first : first + samples_per_shard]
            if first in done:
                skipped += 1
                bar.advance(len(samples))
                continue
            if model is None:
                run_device = resolve_device(device)
                model = load_target_model(target, run_device, target_dtype)
            pieces: list[torch.Tensor] = []
            for start in range(0, len(samples), batch_size):
                chunk = samples[start : start + batch_size]
                width = max(sample.num_tokens for sample in chunk)
                input_ids = torch.zeros((len(chunk), width), dtype=torch.long)
                attention = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, sample in enumerate(chunk):
                    input_ids[row, : sample.num_tokens] = torch.from_numpy(sample.input_ids)
                    attention[row, : sample.num_tokens] = 1
                with torch.no_grad():
                    features = extract_target_features(model, input_ids.to(run_device), attention.to(run_device), layer_ids)
                for row, sample in enumerate(chunk):
                    pieces.append(features[row, : sample.num_tokens].to("cpu", DTYPES[dtype]))
                bar.advance(len(chunk), tokens=sum(sample.num_tokens for sample in chunk))
            lengths = torch.tensor([0] + [sample.num_tokens for sample in samples], dtype=torch.int64)
            tensors = {
                "features": torch.cat(pieces).contiguous(),
                "offsets": torch.cumsum(lengths, 0),
                "input_ids": torch.cat([torch.from_numpy(sample.input_ids) for sample in samples]).to(torch.int32),
            }
            from safetensors.torch import save_file

            name = f"features-{shard_number:05d}.safetensors"
            with atomic_path(out / name) as partial:
                save_file(tensors, str(partial), metadata={"first": str(first), "count": str(len(samples))})
            bytes_written += (out / name).stat().st_size
            shards.append({"file": name, "first": first, "count": len(samples), "ids": [s.id for s in samples]})
            shards.sort(key=lambda shard: shard["first"])
            write_json_atomic(index_path, {**header, "complete": len(shards) == total_shards, "shards": shards})
    if not shards or len(shards) != total_shards:
        write_json_atomic(index_path, {**header, "complete": len(shards) == total_shards, "shards": shards})
    echo(
        f"extracted {len(dataset)} samples, {dataset.total_tokens:,} tokens, layers {layer_ids} "
        f"into {out} ({bytes_written / 1e6:.1f} MB written, {skipped} shard(s) already present)"
    )
    return ExtractResult(
        out_dir=out,
        num_samples=len(dataset),
        total_tokens=dataset.total_tokens,
        layer_ids=layer_ids,
        bytes_written=bytes_written,
        shards=total_shards,
        skipped_shards=skipped,
        elapsed_s=time.perf_counter() - started,
        estimate_summary=summary,
    )


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
        self.dtype = DTYPES[self.index["dtype"]]
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
