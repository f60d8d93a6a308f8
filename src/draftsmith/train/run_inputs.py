"""What a training run checks before its target loads: the data, the output directory, the resume point.

The run manifest records what the run's output depends on, by content, not by path: the target's
tokenizer files and its weights (`weights_fingerprint`: the safetensors headers, file sizes and
sampled bytes of every tensor, ~8 KiB a tensor at any model size), the tokenized data's content (`dataset.fingerprint()`)
and the settings that shape the saved optimizer state and data position. A resume on a target or
data rewritten in place is refused like one on another path.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftsmith.core.errors import InputError
from draftsmith.core.manifest import (MANIFEST_NAME, check_manifest, read_manifest, record_partial_inputs, require_complete,
                                      tokenizer_fingerprint)
from draftsmith.data.sources import check_finished
from draftsmith.data.tokenized import TokenizedDataset, load_tokenized
from draftsmith.model.safetensors_file import read_safetensors_header
from draftsmith.train.checkpoints import checkpoints_newest_first, newest_intact_checkpoint
from draftsmith.train.config import TrainConfig
from draftsmith.train.loader import trainable_indices

# These change what the saved optimizer state and data position mean. `epochs` and `max_steps`
# only say where to stop, so a finished run can be extended by raising them.
RESUME_KEYS = ("block_size", "num_draft_layers", "target_layer_ids", "num_features", "num_anchors", "max_length",
               "batch_size", "grad_accum", "seed", "draft_sliding_window")  # fmt: skip

# How `--num-anchors` counts: per sample, and a sample (a tokenized row) is one document; rows are
# never packed, so a short document gets as many anchors as a long one. The run records this
# ("anchors_per"), so that a change of rule can never pass silently on a resume.
ANCHORS_PER = "document"
# Settings the manifests of older runs did not record, and what those runs did.
UNRECORDED_BEFORE = {"loss_weights": "decay", "dpace_alpha": 0.5, "draft_sliding_window": None, "anchors_per": ANCHORS_PER,
                     "optimizer": "adamw", "soft_targets": "off"}
# Recorded only for a Muon run: they mean nothing to AdamW's.
MUON_KEYS = ("muon_lr", "muon_momentum", "muon_weight_decay", "muon_adjust_lr", "muon_ns_steps")


@dataclass
class RunInputs:
    config: TrainConfig  # the run's settings, with the Markov rank filled in (`with_markov_rank`)
    dataset: TokenizedDataset
    trainable: np.ndarray  # indices of the samples with a usable anchor
    found: tuple[Path, dict] | None  # the checkpoint to resume from (released once restored)
    template: dict | None  # the tokenized set's chat-template record, carried into the drafter


def weights_fingerprint(target_dir: Path) -> str:
    """sha256 over the target's config.json and each weight file's name, size, header and sampled bytes.

    A safetensors header lists every tensor's name, dtype, shape and offsets, which another model
    of the same architecture (a fine-tune) shares, so bytes of every tensor are hashed too:
    `SAMPLES_PER_TENSOR` windows spread over its data. A fine-tune that froze most tensors (the
    embeddings, the LM head) but changed one still differs here. Cost: ~8 KiB read per tensor
    (~10 MiB for a 27B model), at any model size. Other weight files: the first and last MiB.
    """
    target_dir = Path(target_dir)
    digest = hashlib.sha256()
    config = target_dir / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    files = sorted(target_dir.glob("*.safetensors")) + sorted(target_dir.glob("*.bin"))
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}\0{size}\0".encode())
        with file.open("rb") as handle:
            if file.suffix == ".safetensors":
                _hash_safetensors(file, handle, digest)
            else:
                handle.seek(0)
                digest.update(handle.read(1 << 20))
                handle.seek(max(0, size - (1 << 20)))
                digest.update(handle.read(1 << 20))
    return "sha256:" + digest.hexdigest()[:32] if files else f"dir:{target_dir.resolve()}"


SAMPLES_PER_TENSOR, SAMPLE_BYTES = 16, 512


def _hash_safetensors(file: Path, handle, digest) -> None:
    """Header and sampled tensor bytes into `digest`; a header whose offsets or sizes do not hold
    (so the samples would be read from the wrong places) is an `InputError` naming the file."""
    header = read_safetensors_header(file)
    handle.seek(8)
    digest.update(handle.read(header.length))
    length = header.length
    for begin, end in header.spans():
        if end - begin <= SAMPLES_PER_TENSOR * SAMPLE_BYTES:  # a small tensor: all of it
            windows = [(begin, end - begin)]
        else:
            windows = [(int(start), SAMPLE_BYTES) for start in np.linspace(begin, end - SAMPLE_BYTES, SAMPLES_PER_TENSOR)]
        for start, count in windows:
            handle.seek(8 + length + start)
            digest.update(handle.read(count))


def data_directory(data: Path) -> Path:
    """The directory whose manifest speaks for `--data` (the parent of a single shard file)."""
    data = Path(data)
    return data.parent if data.is_file() else data


def tokenized_template(data: Path) -> dict | None:
    """The tokenize manifest's record of the chat template ({"sha256", "kwargs"}), if it has one."""
    manifest = read_manifest(data_directory(data)) if data_directory(data).is_dir() else None
    if not isinstance(manifest, dict):
        return None
    template = manifest.get("template", (manifest.get("settings") or {}).get("template"))
    return template if isinstance(template, dict) else None


def resume_settings(config: TrainConfig, dataset: TokenizedDataset, template: dict | None) -> dict:
    settings = {
        "target": tokenizer_fingerprint(config.target),
        "target_weights": weights_fingerprint(config.target),
        "data": dataset.fingerprint(),
        **config.model_dump(mode="json", include=set(RESUME_KEYS) | {"lr", "gamma", "mask_token_id", "loss_weights", "dpace_alpha",
                                                                     "optimizer", "soft_targets"}),
        **(config.model_dump(mode="json", include=set(MUON_KEYS)) if config.optimizer == "muon" else {}),
        "anchors_per": ANCHORS_PER,
    }
    if template is not None:
        settings["template"] = template
    return settings


def with_markov_rank(config: TrainConfig, found: tuple[Path, dict] | None) -> TrainConfig:
    """A DSpark run without --markov-rank: the rank of the checkpoint it resumes, else the default."""
    if config.drafter != "dspark" or config.markov_rank is not None:
        return config
    saved = found[1]["config"].get("markov_rank") if found is not None else None
    if not isinstance(saved, int):
        from draftsmith.model.dspark import default_markov_rank
        from draftsmith.model.target import load_target_config

        saved = default_markov_rank(int(load_target_config(config.target).get_text_config().vocab_size))
    return config.model_copy(update={"markov_rank": saved})


def check_resume_config(saved: dict, config: TrainConfig, checkpoint: Path) -> None:
    current = config.model_dump(mode="json")
    # Checkpoints from before --drafter existed are DFlash runs.
    if saved.get("drafter", "dflash") != config.drafter:
        raise InputError(f"--drafter {config.drafter}: {checkpoint} is a {saved.get('drafter', 'dflash')} run; "
                         f"resume it with --drafter {saved.get('drafter', 'dflash')} or train into a new --out")
    # Checkpoints from before --optimizer existed hold AdamW's state; one optimizer's state never loads into another's.
    if saved.get("optimizer", "adamw") != config.optimizer:
        raise InputError(f"--optimizer {config.optimizer}: {checkpoint} holds {saved.get('optimizer', 'adamw')}'s optimizer state; "
                         f"resume it with --optimizer {saved.get('optimizer', 'adamw')} or train into a new --out")
    if config.drafter == "dspark" and (saved.get("markov_rank"), saved.get("confidence_head")) != (config.markov_rank, config.confidence_head):
        raise InputError(f"--markov-rank/--confidence-head: {checkpoint} was trained with --markov-rank {saved.get('markov_rank')}, "
                         f"confidence head {'on' if saved.get('confidence_head') else 'off'}; resume with the same")
    different = [key for key in RESUME_KEYS if saved.get(key) != current.get(key)]
    if different:
        raise InputError(
            f"{checkpoint}: cannot resume with different " + ", ".join(f"{k} ({saved.get(k)} -> {current.get(k)})" for k in different)
        )


def _say_what_an_older_run_did_not_record(out_dir: Path) -> None:
    """On resuming a run whose manifest predates the anchor and loss-weight records, say what it did."""
    manifest = read_manifest(out_dir) if out_dir.is_dir() else None
    settings = manifest.get("settings") if isinstance(manifest, dict) else None
    if not isinstance(settings, dict) or "anchors_per" in settings:
        return
    print(f"train: {out_dir}: this run predates the record of how --num-anchors counts; it counted per sample, and "
          f"every sample is one document (rows are never packed), so anchors per document change nothing for it. "
          f"Recorded now: anchors_per {ANCHORS_PER}; loss_weights {settings.get('loss_weights', 'decay')} "
          "(the only weighting then)", file=sys.stderr, flush=True)


def open_run_inputs(config: TrainConfig, context) -> RunInputs:
    """Load and check the data, refuse a fresh run over checkpoints, find the resume point, check the manifest."""
    out_dir = Path(config.out)
    window = config.draft_sliding_window
    if window is not None and window < config.block_size:
        raise InputError(f"--draft-sliding-window {window}: smaller than --block-size {config.block_size}; a block must see "
                         "all of itself (engines require window >= block size)")
    if config.eval_prompts is not None and config.sharding == "fsdp" and context.enabled:
        raise InputError("--eval-prompts runs under --sharding ddp or in one process: a sharded target cannot decode on one rank")
    # A single shard of an unfinished tokenize run is as unfinished as its directory.
    partial = check_finished([config.data], config.allow_partial)
    if not partial:
        partial = require_complete(data_directory(config.data), "the tokenized set",
                                   "rerun `draftsmith tokenize --resume` to finish it", config.allow_partial)
    dataset = load_tokenized(config.data, max_length=config.max_length, split=config.split)
    trainable = trainable_indices(dataset)
    if trainable.size == 0:
        raise InputError(f"{config.data}: no sample has two consecutive loss-mask tokens, nothing to train on")
    if not config.resume and checkpoints_newest_first(out_dir):
        raise InputError(f"{out_dir}: holds checkpoints already; pass --resume to continue or use a new --out")
    # Before the target loads: a run with no usable checkpoint is told so at once.
    found = newest_intact_checkpoint(out_dir) if config.resume else None
    config = with_markov_rank(config, found)
    if found is not None:
        check_resume_config(found[1]["config"], config, found[0])
    template = tokenized_template(config.data)
    if context.is_main:
        if found is None:  # a fresh run: whatever an earlier, checkpoint-less attempt recorded is moot
            (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
        _say_what_an_older_run_did_not_record(out_dir)
        check_manifest(out_dir, "train", resume_settings(config, dataset, template), force=config.force_resume,
                       assumed=UNRECORDED_BEFORE)
        record_partial_inputs(out_dir, partial)
    return RunInputs(config, dataset, trainable, found, template)
