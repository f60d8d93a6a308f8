"""`draftsmith extract`: dump the target's hidden-state features for offline training.

The directory's layout and its reader live in `draftsmith.model.feature_store` (offline training
reads it too). Shards are written to a temporary name and renamed, and the index is rewritten
atomically after each shard, so an interrupted extract resumes at the first missing shard and never
duplicates work.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.core.config import torch_dtype
from draftsmith.core.errors import InputError
from draftsmith.core.io import atomic_path, write_json_atomic
from draftsmith.core.limits import choose_threads
from draftsmith.core.lock import lock_directory
from draftsmith.core.manifest import check_manifest, record_partial_inputs, require_complete, tokenizer_fingerprint
from draftsmith.data.sources import check_finished
from draftsmith.core.progress import LongRunWarning, Progress
from draftsmith.data.tokenized import TokenizedDataset, load_tokenized
from draftsmith.model.config import FEATURE_DEFINITION, resolve_layer_ids
from draftsmith.model.feature_store import FEATURES_KIND, FEATURES_VERSION, INDEX_NAME
from draftsmith.train.config import ExtractConfig
from draftsmith.train.data import check_vocabulary
from draftsmith.train.distributed import resolve_device

SHARD_TARGET_BYTES = 1 << 30


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
    threads: int | None = None,
    force: bool = False,
    allow_partial: bool = False,
    progress: bool = True,
    echo=print,
) -> ExtractResult:
    """Run the target over every sample and write its captured-layer features to shards."""
    started = time.perf_counter()
    # One validation of the settings (dtype spellings, bounds) for the CLI and the Python API alike.
    settings = ExtractConfig(
        target=target, data=data, out=out, num_features=num_features, target_layer_ids=target_layer_ids,
        dtype=dtype, max_length=max_length, batch_size=batch_size, samples_per_shard=samples_per_shard,
        device=device, threads=threads, force=force, allow_partial=allow_partial, progress=progress,
    )
    with lock_directory(settings.out, "extract"):
        return _extract(settings, started, echo)


@dataclass
class _Extraction:
    """What one extract run writes: the data, the captured layers and the index header."""

    dataset: TokenizedDataset
    layer_ids: list[int]
    header: dict
    samples_per_shard: int
    summary: str


def _extract(settings: ExtractConfig, started: float, echo) -> ExtractResult:
    plan = _plan(settings, echo)
    out, dataset = settings.out, plan.dataset
    index_path = out / INDEX_NAME
    shards = _finished_shards(index_path, plan.header)
    done = {shard["first"] for shard in shards}
    total_shards = (len(dataset) + plan.samples_per_shard - 1) // plan.samples_per_shard
    bytes_written, skipped, model = 0, 0, None
    pending = [index for index in range(total_shards) if index * plan.samples_per_shard not in done]
    pending_tokens = sum(sample.num_tokens for index in pending
                         for sample in dataset.samples[index * plan.samples_per_shard:(index + 1) * plan.samples_per_shard])
    _, threads_line = choose_threads(settings.threads, on_cpu=torch.device(resolve_device(settings.device)).type == "cpu")
    if threads_line:
        print(f"extract: {threads_line}", file=sys.stderr, flush=True)
    long_run = LongRunWarning("extract", pending_tokens, "token", [
        f"--max-length (now {settings.max_length}) truncates each sample", "a smaller tokenized set (--data)",
        "a GPU (--device cuda)"], enabled=torch.device(resolve_device(settings.device)).type == "cpu")
    with Progress("extract", len(dataset), unit="samples", enabled=settings.progress) as bar:
        for shard_number in range(total_shards):
            first = shard_number * plan.samples_per_shard
            samples = dataset.samples[first : first + plan.samples_per_shard]
            if first in done:
                skipped += 1
                bar.advance(len(samples))
                continue
            if model is None:
                model = _load_target(settings)
            tensors = _shard_tensors(model, samples, plan.layer_ids, settings, bar, long_run)
            shard = _write_shard(out, shard_number, first, samples, tensors)
            bytes_written += (out / shard["file"]).stat().st_size
            shards = sorted([*shards, shard], key=lambda item: item["first"])
            write_json_atomic(index_path, {**plan.header, "complete": len(shards) == total_shards, "shards": shards})
    if not shards or len(shards) != total_shards:
        write_json_atomic(index_path, {**plan.header, "complete": len(shards) == total_shards, "shards": shards})
    echo(
        f"extracted {len(dataset)} samples, {dataset.total_tokens:,} tokens, layers {plan.layer_ids} "
        f"into {out} ({bytes_written / 1e6:.1f} MB written, {skipped} shard(s) already present)"
    )
    return ExtractResult(
        out_dir=out, num_samples=len(dataset), total_tokens=dataset.total_tokens, layer_ids=plan.layer_ids,
        bytes_written=bytes_written, shards=total_shards, skipped_shards=skipped,
        elapsed_s=time.perf_counter() - started, estimate_summary=plan.summary,
    )  # fmt: skip


def _plan(settings: ExtractConfig, echo) -> _Extraction:
    """Check the target, the data and the disk before any forward; the index header of this run."""
    from draftsmith.model.target import load_target_config, weight_files

    target, out, dtype, max_length = settings.target, settings.out, settings.dtype, settings.max_length
    target_config = load_target_config(target)
    weight_files(target)  # a truncated or corrupt download is named before the data is read
    partial = check_finished([settings.data], settings.allow_partial)
    if not partial:
        partial = require_complete(settings.data, "the tokenized set", "rerun `draftsmith tokenize --resume` to finish it",
                                   settings.allow_partial)
    dataset = load_tokenized(settings.data, max_length=max_length)
    check_vocabulary(dataset, target_config.vocab_size)
    layer_ids = resolve_layer_ids(target_config, settings.num_features, settings.target_layer_ids)
    hidden_size = int(target_config.get_text_config().hidden_size)

    estimate = storage_estimate(hidden_size, len(layer_ids), dataset, dtype, out)
    summary = estimate.summary()
    echo(summary)
    free = shutil.disk_usage(out if out.exists() else next(p for p in out.parents if p.exists())).free
    if estimate.total_bytes > free and not settings.force:
        raise InputError(
            f"{out}: the features need about {estimate.total_bytes / 1e9:.2f} GB but only "
            f"{free / 1e9:.2f} GB are free; train online (no --offline) or pass --force"
        )
    # About 1 GiB per shard by default: few enough files, small enough to hold in RAM while written.
    samples_per_shard = settings.samples_per_shard or int(
        min(10_000, max(1, SHARD_TARGET_BYTES // max(1.0, estimate.bytes_per_sample)))
    )
    header = {
        "kind": FEATURES_KIND, "version": FEATURES_VERSION, "target": str(target.resolve()), "layer_ids": layer_ids,
        "feature_definition": FEATURE_DEFINITION, "hidden_size": hidden_size, "feature_dim": hidden_size * len(layer_ids),
        "dtype": dtype, "max_length": max_length, "data": str(Path(settings.data).resolve()),
        "data_fingerprint": dataset.fingerprint(), "num_samples": len(dataset), "total_tokens": dataset.total_tokens,
        "samples_per_shard": samples_per_shard,
    }  # fmt: skip
    # The settings that change the features; a resume with others would mix two extractions.
    check_manifest(out, "extract", {
        "target": tokenizer_fingerprint(target), "data_fingerprint": header["data_fingerprint"],
        "layer_ids": layer_ids, "feature_definition": FEATURE_DEFINITION, "dtype": dtype, "max_length": max_length,
    }, force_flag=None)  # features of two settings in one directory are never usable: no --force-resume
    record_partial_inputs(out, partial)
    return _Extraction(dataset, layer_ids, header, samples_per_shard, summary)


def _finished_shards(index_path: Path, header: dict) -> list[dict]:
    """The shards an earlier run of the same extraction finished (a resume skips them)."""
    if not index_path.exists():
        return []
    previous = json.loads(index_path.read_text())
    mismatched = [key for key in header if key not in ("target", "data") and previous.get(key) != header[key]]
    if mismatched:
        raise InputError(
            f"{index_path}: existing features were extracted with different "
            f"{', '.join(mismatched)}; extract into a new directory"
        )
    return [shard for shard in previous.get("shards", []) if (index_path.parent / shard["file"]).exists()]


def _load_target(settings: ExtractConfig):
    from draftsmith.model.target import load_target_model

    device = torch.device(resolve_device(settings.device))
    # Stored in the asked dtype either way; on CPU the forward runs in fp32 (no fast bf16 matmuls there).
    return load_target_model(settings.target, device, torch_dtype(settings.dtype) if device.type == "cuda" else torch.float32)


@torch.no_grad()
def _shard_tensors(model, samples, layer_ids: list[int], settings: ExtractConfig, bar,
                   long_run: LongRunWarning | None = None) -> dict[str, torch.Tensor]:
    """The target's captured features of one shard's samples, in batches, as the shard's tensors."""
    from draftsmith.model import extract_target_features

    device, stored = next(model.parameters()).device, torch_dtype(settings.dtype)
    pieces: list[torch.Tensor] = []
    for start in range(0, len(samples), settings.batch_size):
        chunk = samples[start : start + settings.batch_size]
        width = max(sample.num_tokens for sample in chunk)
        input_ids = torch.zeros((len(chunk), width), dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, sample in enumerate(chunk):
            input_ids[row, : sample.num_tokens] = torch.from_numpy(sample.input_ids)
            attention[row, : sample.num_tokens] = 1
        features = extract_target_features(model, input_ids.to(device), attention.to(device), layer_ids)
        pieces += [features[row, : sample.num_tokens].to("cpu", stored) for row, sample in enumerate(chunk)]
        bar.advance(len(chunk), tokens=sum(sample.num_tokens for sample in chunk))
        if long_run is not None:
            long_run.observe(bar.tokens)
    lengths = torch.tensor([0] + [sample.num_tokens for sample in samples], dtype=torch.int64)
    return {
        "features": torch.cat(pieces).contiguous(),
        "offsets": torch.cumsum(lengths, 0),
        "input_ids": torch.cat([torch.from_numpy(sample.input_ids) for sample in samples]).to(torch.int32),
    }


def _write_shard(out: Path, shard_number: int, first: int, samples, tensors: dict[str, torch.Tensor]) -> dict:
    """One shard file, renamed into place whole; its entry for the index."""
    from safetensors.torch import save_file

    name = f"features-{shard_number:05d}.safetensors"
    with atomic_path(out / name) as partial:
        save_file(tensors, str(partial), metadata={"first": str(first), "count": str(len(samples))})
    return {"file": name, "first": first, "count": len(samples), "ids": [sample.id for sample in samples]}
