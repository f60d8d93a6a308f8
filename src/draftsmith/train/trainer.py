"""Training a DFlash drafter: `train_drafter(TrainConfig) -> TrainResult`.

One micro-batch = `batch_size` sequences. For each, the target's captured-layer features come from a
frozen target forward (online) or a features directory (offline); anchors are drawn by a generator
owned by (seed, epoch, sample), so the blocks do not depend on who draws them or when (exact resume,
online == offline, any number of ranks). The drafter sees [context features | blocks] with the mask
of `blocks.py`; its hidden states go through the target's frozen LM head into the weighted loss of
`loss.py`.

Normalisation: each micro-batch's loss is sum(w*CE)/sum(w) over its own predictions; gradient
accumulation averages the micro-batches of a step and DDP averages the ranks, so every micro-batch
counts equally whatever its number of blocks.

Data order: each epoch is a seeded permutation of the samples, split round-robin over ranks (padded
by wrapping so every rank runs the same number of steps). Checkpoints hold the drafter, optimizer,
scheduler, step, data position and RNG states, are written to a temporary directory and renamed,
and resume continues with exactly the micro-batches that would have come next.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from draftsmith.core.config import torch_dtype
from draftsmith.core.io import publish, write_json_atomic
from draftsmith.core.lock import lock_directory
from draftsmith.core.progress import Progress
from draftsmith.core.errors import InputError
from draftsmith.core.manifest import MANIFEST_NAME, check_manifest, require_complete, tokenizer_fingerprint
from draftsmith.core.paths import require_output_dir
from draftsmith.train.anchors import anchor_generator, sample_anchors, valid_anchor_positions
from draftsmith.train.blocks import BlockBatch, build_block_batch
from draftsmith.data.tokenized import TokenizedDataset, load_tokenized
from draftsmith.train.checkpoints import CHECKPOINT_DIR, STATE_FILE, cut_log, newest_intact_checkpoint, numpy_rng_state, set_numpy_rng_state
from draftsmith.train.config import TrainConfig
from draftsmith.train.data import check_vocabulary
from draftsmith.train.distributed import (
    DistributedContext,
    all_reduce_sum,
    barrier,
    gather_floats,
    init_distributed,
    parameter_checksum,
    shutdown,
)
from draftsmith.train.loss import default_gamma, dflash_loss_from_hidden, position_weights
from draftsmith.train.reporting import check_report_to, make_reporter

FINAL_DIR = "drafter"
LOG_FILE = "train_log.jsonl"


@dataclass
class TrainResult:
    out_dir: Path
    drafter_dir: Path
    steps: int
    epochs: int
    losses: list[tuple[int, float]]
    first_loss: float
    final_loss: float
    tokens_seen: int
    elapsed_s: float
    tokens_per_s: float
    accuracy_by_offset: list[float]
    train_tau: float
    rank_checksums: list[float]
    world_size: int
    resumed_from_step: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        payload = {key: getattr(self, key) for key in self.__dataclass_fields__}
        payload["out_dir"] = str(self.out_dir)
        payload["drafter_dir"] = str(self.drafter_dir)
        return payload


def lr_lambda_factory(total_steps: int, warmup_steps: int, min_ratio: float):
    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def epoch_order(num_samples: int, seed: int, epoch: int, context: DistributedContext) -> list[int]:
    """This rank's sample indices for an epoch (same length on every rank)."""
    generator = torch.Generator()
    generator.manual_seed(seed * 7919 + epoch)
    order = torch.randperm(num_samples, generator=generator).tolist()
    per_rank = math.ceil(num_samples / context.world_size)
    padded = (order * (1 + per_rank * context.world_size // max(1, num_samples)))[: per_rank * context.world_size]
    return padded[context.rank :: context.world_size]


def micro_batches(order: list[int], batch_size: int) -> list[list[int]]:
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def steps_per_epoch(num_micro_batches: int, grad_accum: int) -> int:
    return math.ceil(num_micro_batches / grad_accum)


class DrafterTrainer:
    """Holds the frozen target parts, the drafter and the loss; one call per micro-batch."""

    def __init__(self, config: TrainConfig, context: DistributedContext, dataset: TokenizedDataset):
        from draftsmith.model import DFlashDraftModel, build_drafter_config
        from draftsmith.model.block_attention import choose_attention
        from draftsmith.train.extract import FeatureStore, mask_token_id_for, resolve_layer_ids
        from draftsmith.model.target import load_embedding_and_head, load_target_config, load_target_model

        self.config = config
        self.context = context
        self.device = context.device
        self.dataset = dataset
        compute = config.dtype if config.dtype != "auto" else ("bfloat16" if self.device.type == "cuda" else "float32")
        self.autocast_dtype = None if compute == "float32" else torch_dtype(compute)
        self.compute_dtype_name = compute
        target_config = load_target_config(config.target)
        check_vocabulary(dataset, target_config.vocab_size)
        self.features = None
        layer_ids = config.target_layer_ids
        if config.offline_features is not None:
            self.features = FeatureStore(config.offline_features)
            self.features.check_matches(dataset, config.max_length)
            if layer_ids is not None and list(layer_ids) != self.features.layer_ids:
                raise InputError(
                    f"{config.offline_features}: features hold layers {self.features.layer_ids}, "
                    f"but --target-layer-ids asks for {layer_ids}"
                )
            layer_ids = self.features.layer_ids
            last = int(target_config.get_text_config().num_hidden_layers) - 1
            if self.features.feature_definition is None and last in layer_ids:
                raise InputError(
                    f"{config.offline_features}: extracted by an older draftsmith, whose feature for the target's "
                    f"last layer ({last}) was the post-norm hidden state engines never feed; re-run `draftsmith extract`"
                )
        if layer_ids is None:
            layer_ids = resolve_layer_ids(target_config, config.num_features, None)
        mask_token_id = config.mask_token_id if config.mask_token_id is not None else mask_token_id_for(config.target)
        self.mask_token_id = mask_token_id
        self.drafter_config = build_drafter_config(
            target_config,
            num_draft_layers=config.num_draft_layers,
            block_size=config.block_size,
            target_layer_ids=layer_ids,
            mask_token_id=mask_token_id,
        )
        self.layer_ids = list(self.drafter_config.target_layer_ids)

        target_dtype = torch_dtype(compute) if (compute != "float32" and self.device.type == "cuda") else torch.float32
        if self.features is None:
            self.target = load_target_model(config.target, self.device, target_dtype)
            self.embed_tokens = self.target.get_input_embeddings()
            self.lm_head = self.target.get_output_embeddings()
        else:
            self.target = None
            self.embed_tokens, self.lm_head = load_embedding_and_head(config.target, self.device, target_dtype)

        # The same seed gives the same initial drafter on every rank and in every mode.
        torch.manual_seed(config.seed)
        self.drafter = DFlashDraftModel(self.drafter_config).to(self.device, torch.float32)
        if config.gradient_checkpointing:
            enable = getattr(self.drafter, "activation_checkpointing_enable", None) or self.drafter.gradient_checkpointing_enable
            enable()
        self.drafter.train()
        self.weights = position_weights(config.block_size, config.gamma).to(self.device)
        self.attention = choose_attention(config.attention, self.device)
        self.gamma = config.gamma if config.gamma is not None else default_gamma(config.block_size)

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def anchors_for(self, sample_index: int, epoch: int) -> torch.Tensor:
        sample = self.dataset[sample_index]
        generator = anchor_generator(self.config.seed, epoch, sample_index)
        return sample_anchors(torch.from_numpy(sample.loss_mask), self.config.num_anchors, generator)

    def make_batch(self, sample_indices: list[int], epoch: int) -> BlockBatch:
        sequences = []
        for index in sample_indices:
            sample = self.dataset[index]
            sequences.append(
                (torch.from_numpy(sample.input_ids), torch.from_numpy(sample.loss_mask), self.anchors_for(index, epoch))
            )
        return build_block_batch(sequences, self.config.block_size, self.mask_token_id)

    @torch.no_grad()
    def context_features(self, batch: BlockBatch, sample_indices: list[int]) -> torch.Tensor:
        if self.features is None:
            from draftsmith.model import extract_target_features

            context_mask = batch.context_mask.to(self.device)
            with self.autocast():
                features = extract_target_features(self.target, batch.context_ids.to(self.device), context_mask, self.layer_ids)
            # Padding is never attended to; zeroing it makes online and offline inputs identical.
            return features * context_mask[..., None].to(features.dtype)
        rows = [self.features.get(index, self.dataset[index].id) for index in sample_indices]
        width = batch.context_ids.shape[1]
        # Stored in bf16 by default; the drafter's fp32 weights (or autocast) take it from float32.
        stacked = torch.zeros((len(rows), width, rows[0].shape[-1]), dtype=torch.float32)
        for row, features in enumerate(rows):
            stacked[row, : features.shape[0]] = features.float()
        return stacked.to(self.device)

    def forward_loss(self, drafter, sample_indices: list[int], epoch: int):
        """Loss of one micro-batch; `drafter` is the (possibly DDP-wrapped) module to call."""
        batch = self.make_batch(sample_indices, epoch)
        features = self.context_features(batch, sample_indices)
        with torch.no_grad():
            noise = self.embed_tokens(batch.noise_ids.to(self.device))
        with self.autocast():
            hidden = drafter(
                position_ids=batch.position_ids.to(self.device),
                # Checkpointed layers already recompute attention in backward; tiles need not again.
                attention_mask=batch.layout(self.attention, False if self.config.gradient_checkpointing else None).to(self.device),
                noise_embedding=noise,
                target_hidden=features,
            )
            num_sequences, num_anchors = batch.anchors.shape
            hidden = hidden.view(num_sequences, num_anchors, self.config.block_size, -1)[:, :, 1:]
            output = dflash_loss_from_hidden(
                hidden,
                lambda rows: self.drafter.compute_logits(rows, self.lm_head),
                batch.labels.to(self.device),
                batch.label_mask.to(self.device),
                self.weights,
            )
        return output, batch


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    set_numpy_rng_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and state.get("cuda") is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


def _rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": numpy_rng_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def latest_checkpoint(out_dir: Path) -> Path | None:
    root = out_dir / CHECKPOINT_DIR
    if not root.exists():
        return None
    finished = sorted(path for path in root.glob("step-*") if (path / STATE_FILE).exists())
    return finished[-1] if finished else None


def _save_checkpoint(trainer: DrafterTrainer, optimizer, scheduler, state: dict, out_dir: Path, keep: int) -> Path:
    from draftsmith.model import save_drafter

    root = out_dir / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state['step']:08d}"
    partial = root / f".step-{state['step']:08d}.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    save_drafter(trainer.drafter, partial)
    torch.save(
        {
            **state,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "drafter_state": trainer.drafter.state_dict(),
            "rng": _rng_state(),
            "config": trainer.config.model_dump(mode="json"),
        },
        partial / STATE_FILE,
    )
    if final.exists():
        shutil.rmtree(final)
    publish(partial, final)
    finished = sorted(path for path in root.glob("step-*") if (path / STATE_FILE).exists())
    for old in finished[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


# These change what the saved optimizer state and data position mean. `epochs` and `max_steps`
# only say where to stop, so a finished run can be extended by raising them.
RESUME_KEYS = ("block_size", "num_draft_layers", "target_layer_ids", "num_features", "num_anchors", "max_length", "batch_size", "grad_accum", "seed")


def _check_resume_config(saved: dict, config: TrainConfig, checkpoint: Path) -> None:
    keys = RESUME_KEYS
    current = config.model_dump(mode="json")
    different = [key for key in keys if saved.get(key) != current.get(key)]
    if different:
        raise InputError(
            f"{checkpoint}: cannot resume with different " + ", ".join(f"{k} ({saved.get(k)} -> {current.get(k)})" for k in different)
        )


def train_drafter(config: TrainConfig) -> TrainResult:
    """Train (or resume training) a drafter; the final checkpoint lands in `<out>/drafter`."""
    from draftsmith.model import save_drafter

    check_report_to(config.report_to)  # before anything is loaded or --out is made
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    require_output_dir(config.out, "--out")
    context = init_distributed(config.device)
    try:
        # Every rank of one run writes --out; only the main rank holds its lock against other runs.
        with lock_directory(config.out, "train") if context.is_main else contextlib.nullcontext():
            return _train(config, context, save_drafter)
    finally:
        shutdown(context)


def _train(config: TrainConfig, context: DistributedContext, save_drafter) -> TrainResult:
    started = time.perf_counter()
    out_dir = Path(config.out)
    require_complete(config.data, "the tokenized set", "rerun `draftsmith tokenize --resume` to finish it")
    dataset = load_tokenized(config.data, max_length=config.max_length, split=config.split)
    trainable = [index for index, sample in enumerate(dataset.samples) if valid_anchor_positions(torch.from_numpy(sample.loss_mask)).numel() > 0]
    if not trainable:
        raise InputError(f"{config.data}: no sample has two consecutive loss-mask tokens, nothing to train on")
    if not config.resume and latest_checkpoint(out_dir) is not None:
        raise InputError(f"{out_dir}: holds checkpoints already; pass --resume to continue or use a new --out")
    # Before the target loads: a run with no usable checkpoint is told so at once.
    found = newest_intact_checkpoint(out_dir) if config.resume else None
    if found is not None:
        _check_resume_config(found[1]["config"], config, found[0])
    if context.is_main:
        if found is None:  # a fresh run: whatever an earlier, checkpoint-less attempt recorded is moot
            (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
        settings = {"target": tokenizer_fingerprint(config.target), "data": str(Path(config.data).resolve()),
                    **config.model_dump(mode="json", include=set(RESUME_KEYS) | {"lr", "gamma", "mask_token_id"})}  # fmt: skip
        check_manifest(out_dir, "train", settings, force=config.force_resume)
    trainer = DrafterTrainer(config, context, dataset)
    drafter = trainer.drafter
    if context.enabled:
        from torch.nn.parallel import DistributedDataParallel

        drafter = DistributedDataParallel(drafter, device_ids=[context.device.index] if context.device.type == "cuda" else None)

    # Samples without a usable anchor are skipped, keeping the original indices for features and seeds.
    def order_for(epoch: int) -> list[int]:
        return [trainable[i] for i in epoch_order(len(trainable), config.seed, epoch, context)]

    per_epoch_micro = len(micro_batches(order_for(0), config.batch_size))
    per_epoch_steps = steps_per_epoch(per_epoch_micro, config.grad_accum)
    total_steps = per_epoch_steps * config.epochs
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    warmup_steps = int(round(config.warmup_ratio * total_steps))

    decay, no_decay = [], []
    for name, parameter in trainer.drafter.named_parameters():
        (no_decay if parameter.ndim < 2 or "norm" in name else decay).append(parameter)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=config.betas,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_factory(total_steps, warmup_steps, config.min_lr_ratio))

    step, epoch, step_in_epoch, tokens_seen = 0, 0, 0, 0
    resumed_from = None
    losses: list[tuple[int, float]] = []
    if config.resume:
        if found is not None:
            checkpoint, saved = found
            trainer.drafter.load_state_dict(saved["drafter_state"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            step, epoch, step_in_epoch = saved["step"], saved["epoch"], saved["step_in_epoch"]
            tokens_seen = saved["tokens_seen"]
            losses = [tuple(item) for item in saved.get("losses", [])]
            _set_rng_state(saved["rng"])
            resumed_from = step
    barrier(context)

    if context.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "train_config.json").write_text(json.dumps(config.model_dump(mode="json"), indent=1))
        mode = "offline" if config.offline_features else "online"
        print(
            f"training a {config.num_draft_layers}-layer drafter (block {config.block_size}, gamma {trainer.gamma:g}, "
            f"layers {trainer.layer_ids}, {mode}, {trainer.compute_dtype_name}, {trainer.attention} attention) on {len(trainable)} samples "
            f"x {config.epochs} epochs = {total_steps} steps"
            + (" (capped by max_steps)" if total_steps < per_epoch_steps * config.epochs else "")
            + f", {context.world_size} process(es)"
            + (f"; resuming at step {step}" if resumed_from is not None else ""),
            file=sys.stderr,
        )
    if context.is_main:
        cut_log(out_dir / LOG_FILE, step)  # records past the checkpoint would repeat
    log_handle = (out_dir / LOG_FILE).open("a") if context.is_main else None
    reporter = make_reporter(config.report_to if context.is_main else "none", out_dir, config.model_dump(mode="json"))
    progress = Progress("train", total_steps, unit="steps", token_unit="tok", enabled=config.progress and context.is_main,
                        completed=step).__enter__()

    block_offsets = config.block_size - 1
    correct = torch.zeros(block_offsets, dtype=torch.float64)
    counted = torch.zeros(block_offsets, dtype=torch.float64)
    prefix_sum, block_count = 0.0, 0.0
    window_loss, window_weight, window_tokens, window_start = 0.0, 0.0, 0, time.perf_counter()
    last_checkpoint_step = step if resumed_from is not None else -1
    last_record: dict = {}

    def checkpoint_now() -> None:
        nonlocal last_checkpoint_step
        if context.is_main:
            _save_checkpoint(
                trainer,
                optimizer,
                scheduler,
                {"step": step, "epoch": epoch, "step_in_epoch": step_in_epoch, "tokens_seen": tokens_seen, "losses": losses},
                out_dir,
                config.keep_checkpoints,
            )
        last_checkpoint_step = step
        barrier(context)

    try:
        while epoch < config.epochs and step < total_steps:
            batches = micro_batches(order_for(epoch), config.batch_size)
            groups = [batches[start : start + config.grad_accum] for start in range(0, len(batches), config.grad_accum)]
            while step_in_epoch < len(groups) and step < total_steps:
                group = groups[step_in_epoch]
                optimizer.zero_grad(set_to_none=True)
                step_loss_sum = torch.zeros(2, dtype=torch.float64)
                step_tokens = 0
                for micro_index, sample_indices in enumerate(group):
                    sync = micro_index == len(group) - 1
                    no_sync = drafter.no_sync() if (context.enabled and not sync) else nullcontext()
                    with no_sync:
                        output, batch = trainer.forward_loss(drafter, sample_indices, epoch)
                        (output.loss / len(group)).backward()
                    step_loss_sum += torch.tensor([float(output.loss.detach()), 1.0], dtype=torch.float64)
                    step_tokens += batch.num_tokens
                    correct += output.correct.double().cpu()
                    counted += output.counted.double().cpu()
                    prefix_sum += float(output.accepted_prefix)
                    block_count += float(output.blocks)
                if config.grad_clip > 0:
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(trainer.drafter.parameters(), config.grad_clip))
                else:
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(trainer.drafter.parameters(), float("inf")))
                optimizer.step()
                scheduler.step()
                step += 1
                step_in_epoch += 1
                reduced = all_reduce_sum(torch.tensor([step_loss_sum[0], step_loss_sum[1], float(step_tokens)], dtype=torch.float64), context)
                step_loss = float(reduced[0] / reduced[1])
                tokens_seen += int(reduced[2])
                losses.append((step, step_loss))
                window_loss += step_loss
                window_weight += 1
                window_tokens += int(reduced[2])
                elapsed = time.perf_counter() - window_start
                accuracy = correct / counted.clamp_min(1)
                progress.advance(step - progress.done, tokens=int(reduced[2]), loss=f"{step_loss:.4f}", acc=f"{float(accuracy[0]):.3f}")
                if log_handle is not None and (step % config.log_every == 0 or step == total_steps):
                    record = {
                        "step": step,
                        "epoch": epoch,
                        "loss": window_loss / window_weight,
                        "lr": scheduler.get_last_lr()[0],
                        "grad_norm": grad_norm,
                        "tokens_per_s": window_tokens / max(elapsed, 1e-9),
                        "acc_by_offset": [round(float(value), 4) for value in accuracy],
                        "train_tau": 1 + prefix_sum / max(block_count, 1),
                    }
                    last_record = record
                    log_handle.write(json.dumps(record) + "\n")
                    log_handle.flush()
                    reporter.log(step, record)
                    if not config.progress:
                        print(
                            f"step {step}/{total_steps} loss {record['loss']:.4f} acc@1 {float(accuracy[0]):.3f} "
                            f"tau~{record['train_tau']:.2f} {record['tokens_per_s']:,.0f} tok/s",
                            file=sys.stderr,
                            flush=True,
                        )
                    window_loss, window_weight, window_tokens, window_start = 0.0, 0.0, 0, time.perf_counter()
                    correct.zero_()
                    counted.zero_()
                    prefix_sum, block_count = 0.0, 0.0
                if config.save_every and step % config.save_every == 0 and step < total_steps:
                    checkpoint_now()
            if step_in_epoch >= len(groups):
                epoch += 1
                step_in_epoch = 0
                if config.save_every == 0 and epoch < config.epochs and step < total_steps:
                    checkpoint_now()
        if last_checkpoint_step != step:
            checkpoint_now()
    finally:
        progress.__exit__(None, None, None)
        reporter.close()
        if log_handle is not None:
            log_handle.close()

    checksums = gather_floats(parameter_checksum(trainer.drafter), context)
    drafter_dir = out_dir / FINAL_DIR
    if context.is_main:
        partial = out_dir / f".{FINAL_DIR}.partial"
        if partial.exists():
            shutil.rmtree(partial)
        save_drafter(trainer.drafter, partial)
        if drafter_dir.exists():
            shutil.rmtree(drafter_dir)
        publish(partial, drafter_dir)
    barrier(context)
    elapsed = time.perf_counter() - started
    if counted.sum() > 0:
        last_record = {"acc_by_offset": (correct / counted.clamp_min(1)).tolist(), "train_tau": 1 + prefix_sum / max(block_count, 1)}
    result = TrainResult(
        out_dir=out_dir,
        drafter_dir=drafter_dir,
        steps=step,
        epochs=epoch,
        losses=losses,
        first_loss=losses[0][1] if losses else float("nan"),
        final_loss=float(np.mean([loss for _, loss in losses[-max(1, min(10, len(losses))) :]])) if losses else float("nan"),
        tokens_seen=tokens_seen,
        elapsed_s=elapsed,
        tokens_per_s=tokens_seen / max(elapsed, 1e-9),
        accuracy_by_offset=list(last_record.get("acc_by_offset", [])),
        train_tau=float(last_record.get("train_tau", float("nan"))),
        rank_checksums=checksums,
        world_size=context.world_size,
        resumed_from_step=resumed_from,
    )
    if context.is_main:
        summary = result.to_dict()
        summary["losses"] = [list(item) for item in losses]
        write_json_atomic(out_dir / "train_summary.json", summary, indent=1)
    return result
