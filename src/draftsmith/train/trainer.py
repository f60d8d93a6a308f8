"""Training a DFlash drafter: `train_drafter(TrainConfig) -> TrainResult`.

One micro-batch = `batch_size` sequences. For each, the target's captured-layer features come from a
frozen target forward (online) or a features directory (offline); anchors are drawn by a generator
owned by (seed, epoch, sample), so the blocks do not depend on who draws them or when (exact resume,
online == offline, any number of ranks or loader workers). The drafter sees [context features |
blocks] with the mask of `blocks.py`; its hidden states go through the target's frozen LM head into
the weighted loss of `loss.py`.

Normalisation (`--loss-weights`, see loss.py): with "decay" each micro-batch's loss is
sum(w*CE)/sum(w) over its own predictions; gradient accumulation averages the micro-batches of a
step and DDP/FSDP average the ranks, so every micro-batch counts equally whatever its number of
blocks. With "dpace" the step's loss is sum(w*CE) over all its blocks divided by the step's block
count over every micro-batch and rank (all-reduced before the forward), so the update does not
depend on how the step's data is split.

The run is laid out as torchtitan lays out its trainer: the input pipeline (`loader.py`), the
parallelism (`parallel.py`), a `TrainState` and a `MetricsAccumulator` (`state.py`) and a
`Checkpointer` (`checkpoints.py`), each saving and restoring itself; `_train` below is the loop.
A loss, gradient norm or parameter that turns non-finite stops the run (exit 1) at the next log or checkpoint
step, naming the first bad step; checkpoints and the drafter are written only after that check.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from draftsmith.core.config import cpu_multiplies_bf16_natively, torch_dtype
from draftsmith.core.errors import InputError
from draftsmith.core.io import open_append, write_atomic, write_json_atomic
from draftsmith.core.limits import choose_threads, workers_for
from draftsmith.core.lock import lock_directory
from draftsmith.core.manifest import MANIFEST_NAME, check_manifest
from draftsmith.core.paths import require_output_dir
from draftsmith.core.progress import LongRunWarning, Progress
from draftsmith.data.tokenized import TokenizedDataset
from draftsmith.train.blocks import BlockBatch
from draftsmith.train.checkpoints import CHECKPOINT_DIR, Checkpointer, cut_log, newest_intact_checkpoint
from draftsmith.train.config import TrainConfig
from draftsmith.train.distributed import (
    DistributedContext, all_reduce_sum, broadcast_object, gather_floats, init_distributed, parameter_checksum, shutdown,
)
from draftsmith.train.evaluation import BEST_DIR, SpeculativeEval, published_best
from draftsmith.train.loader import StepBatch, StepSampler, StepSource, make_loader, steps_per_epoch
from draftsmith.train.loss import (
    StepNormaliser,
    TargetRows,
    default_gamma,
    dflash_loss_from_hidden,
    dspark_loss_from_hidden,
    position_weighting,
    step_block_count,
)
from draftsmith.train.parallel import clip_gradients, gradient_sync, parallelize_drafter, shard_target
from draftsmith.train.reporting import check_report_to, make_reporter
from draftsmith.train.run_inputs import RunInputs, open_run_inputs, resume_settings
from draftsmith.train.state import MetricsAccumulator, TrainingDiverged, TrainState, first_nonfinite

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
    # Share of the trainable (loss-mask) tokens some block predicted, over the run's steps (all ranks).
    anchor_coverage: float = float("nan")
    resumed_from_step: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        payload = {key: getattr(self, key) for key in self.__dataclass_fields__}
        payload["out_dir"] = str(self.out_dir)
        payload["drafter_dir"] = str(self.drafter_dir)
        payload["losses"] = [list(item) for item in self.losses]
        return payload


def lr_lambda_factory(total_steps: int, warmup_steps: int, min_ratio: float):
    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class DrafterTrainer:
    """Holds the frozen target parts, the drafter and the loss; one call per micro-batch."""

    def __init__(self, config: TrainConfig, context: DistributedContext, dataset: TokenizedDataset, template: dict | None = None):
        from draftsmith.model import DFlashDraftModel, build_drafter_config
        from draftsmith.model.block_attention import choose_attention
        from draftsmith.model.target import load_embedding_and_head, load_target_config, load_target_model
        from draftsmith.model.features import mask_token_for, target_embed_tokens

        self.config, self.context, self.device, self.dataset = config, context, context.device, dataset
        compute = config.dtype if config.dtype != "auto" else ("bfloat16" if self.device.type == "cuda" else "float32")
        self.autocast_dtype = None if compute == "float32" else torch_dtype(compute)
        self.compute_dtype_name = compute
        target_config = load_target_config(config.target)
        from draftsmith.train.data import check_vocabulary

        check_vocabulary(dataset, target_config.vocab_size)
        self.features, layer_ids = self._feature_source(target_config)
        self.mask = mask_token_for(config.target, config.mask_token_id)
        self.mask_token_id = self.mask.token_id
        self.drafter_config = build_drafter_config(
            target_config, num_draft_layers=config.num_draft_layers, block_size=config.block_size,
            target_layer_ids=layer_ids, mask_token_id=self.mask_token_id, sliding_window=config.draft_sliding_window,
        )  # fmt: skip
        self.dspark = config.drafter == "dspark"
        if self.dspark:
            from draftsmith.model.dspark import build_dspark_config

            if context.enabled and config.sharding == "fsdp":
                raise InputError("--drafter dspark: --sharding fsdp is not supported yet (the Markov and confidence "
                                 "heads run outside the sharded forward); use --sharding ddp")
            if self.mask.record().get("mask_token_source") == "drafter_embedding":
                raise InputError(f"--drafter dspark: {config.target} has no spare token id for the mask, and vLLM's DSpark "
                                 "masks through the vocabulary row (it ignores mask_embedding.pt); pass --mask-token-id")
            self.drafter_config = build_dspark_config(self.drafter_config, config.markov_rank, config.confidence_head)
        # How the mask was chosen travels with the drafter, so `check` can confirm it against the target.
        self.drafter_config.dflash_config = {**self.drafter_config.dflash_config, **self.mask.record()}
        if template is not None:  # the chat template the data was rendered with travels with the drafter
            self.drafter_config.dflash_config = {**self.drafter_config.dflash_config, "template": template}
        self.layer_ids = list(self.drafter_config.target_layer_ids)

        # The frozen target's weights are kept in the run's compute dtype: on CPU that is fp32 unless
        # --dtype asks otherwise (bf16 pays off where the CPU multiplies bf16 natively, e.g. AMX).
        self.target_dtype = torch_dtype(compute)
        if self.features is None:
            self.target = load_target_model(config.target, self.device, self.target_dtype)
            self.embed_tokens = target_embed_tokens(self.target)
            self.lm_head = self.target.get_output_embeddings()
            shard_target(self.target, context, config.sharding)
        else:
            self.target = None
            self.embed_tokens, self.lm_head = load_embedding_and_head(config.target, self.device, self.target_dtype)
        self.final_norm = self.last_layer_slot = None
        if self.features is not None and config.soft_targets != "off":
            from draftsmith.model.target import load_final_norm

            # Offline soft targets: the last layer's stored feature (its pre-norm output, `check_recipe_options`)
            # through the target's final norm and LM head is the target's own next-token logits.
            self.final_norm = load_final_norm(config.target, self.device, self.target_dtype)
            self.last_layer_slot = self.layer_ids.index(int(target_config.get_text_config().num_hidden_layers) - 1)

        # The same seed gives the same initial drafter on every rank and in every mode.
        torch.manual_seed(config.seed)
        from draftsmith.model.io import drafter_class

        self.drafter = drafter_class(self.drafter_config)(self.drafter_config).to(self.device, torch.float32)
        if config.init_from_target:
            self._init_from_target(load_target_model)
        if config.gradient_checkpointing:
            enable = getattr(self.drafter, "activation_checkpointing_enable", None) or self.drafter.gradient_checkpointing_enable
            enable()
        self.drafter.train()
        # Predictions per block: B-1 (DFlash), B (DSpark predicts from the anchor on).
        self.predictions = config.block_size if self.dspark else config.block_size - 1
        self.weighting = position_weighting(config.loss_weights, self.predictions + 1, config.gamma,
                                            config.dpace_alpha).to(self.device)
        self.attention = choose_attention(config.attention, self.device, float(self.drafter_config.attention_dropout or 0.0))
        self.gamma = config.gamma if config.gamma is not None else default_gamma(self.predictions + 1)
        self.last_grad_norm = torch.zeros((), device=self.device)
        self.source = StepSource(dataset, seed=config.seed, num_anchors=config.num_anchors, block_size=config.block_size,
                                 mask_token_id=self.mask_token_id, features=self.features, from_anchor=self.dspark)  # fmt: skip

    def _init_from_target(self, load_target_model) -> None:
        from draftsmith.model import init_drafter_from_target

        # Offline and sharded runs hold no whole target here: read one on the CPU just for the copy.
        whole = self.target if self.target is not None and self.config.sharding != "fsdp" else None
        source = whole if whole is not None else load_target_model(self.config.target, "cpu", torch.float32)
        copied = init_drafter_from_target(self.drafter, source)
        del source
        if self.context.is_main:
            print(f"train: --init-from-target copied {len(copied)} tensors from the target", file=sys.stderr, flush=True)

    def _feature_source(self, target_config):
        """(FeatureStore or None, the captured layer ids) after checking offline features fit the run."""
        from draftsmith.model.config import resolve_layer_ids
        from draftsmith.model.feature_store import FeatureStore

        config = self.config
        if config.offline_features is None:
            return None, resolve_layer_ids(target_config, config.num_features, config.target_layer_ids)
        features = FeatureStore(config.offline_features)
        features.check_matches(self.dataset, config.max_length)
        if config.target_layer_ids is not None and list(config.target_layer_ids) != features.layer_ids:
            raise InputError(
                f"{config.offline_features}: features hold layers {features.layer_ids}, "
                f"but --target-layer-ids asks for {config.target_layer_ids}"
            )
        last = int(target_config.get_text_config().num_hidden_layers) - 1
        if features.feature_definition is None and last in features.layer_ids:
            raise InputError(
                f"{config.offline_features}: extracted by an older draftsmith, whose feature for the target's "
                f"last layer ({last}) was the post-norm hidden state engines never feed; re-run `draftsmith extract`"
            )
        return features, features.layer_ids

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def make_batch(self, sample_indices: list[int], epoch: int) -> BlockBatch:
        return self.source.block_batch(sample_indices, epoch)

    @torch.no_grad()
    def context_features(self, batch: BlockBatch, sample_indices: list[int], stored: torch.Tensor | None = None) -> torch.Tensor:
        """The drafter's context: target features of the batch, from a target forward (online) or
        the features directory (offline; `stored`: what the loader's workers read ahead)."""
        return self.context_inputs(batch, sample_indices, stored)[0]

    @torch.no_grad()
    def context_inputs(self, batch: BlockBatch, sample_indices: list[int], stored: torch.Tensor | None = None):
        """(`context_features`, the target's final-norm hidden states [S, T, H] where soft targets need
        them, else None)."""
        if self.features is None:
            from draftsmith.model import extract_target_features

            context_mask = batch.context_mask.to(self.device, non_blocking=True)
            final = None
            with self.autocast():
                ids = batch.context_ids.to(self.device, non_blocking=True)
                if self.config.soft_targets != "off":
                    features, final = extract_target_features(self.target, ids, context_mask, self.layer_ids, with_final_hidden=True)
                else:
                    features = extract_target_features(self.target, ids, context_mask, self.layer_ids)
            # Padding is never attended to; zeroing it makes online and offline inputs identical.
            return features * context_mask[..., None].to(features.dtype), final
        if stored is None:
            stored = self.source.stored_features(sample_indices, batch.context_ids.shape[1])
        # Stored in bf16 by default, copied as stored (pinned on CUDA); the drafter's fp32 weights (or autocast) take float32.
        features = stored.to(self.device, non_blocking=True).float()
        if self.final_norm is None:
            return features, None
        width = features.shape[-1] // len(self.layer_ids)
        last = features[..., self.last_layer_slot * width : (self.last_layer_slot + 1) * width]
        with self.autocast():
            return features, self.final_norm(last.to(self.target_dtype))

    def forward_loss(self, drafter, sample_indices: list[int], epoch: int):
        """Loss of one micro-batch; `drafter` is the (possibly DDP/FSDP-wrapped) module to call."""
        batch = self.make_batch(sample_indices, epoch)
        return self.forward_batch(drafter, batch, sample_indices), batch

    def forward_batch(self, drafter, batch: BlockBatch, sample_indices: list[int], stored: torch.Tensor | None = None,
                      denominator: torch.Tensor | None = None):
        """The micro-batch's `LossOutput`; `denominator`: the step's block count where the weighting
        normalises over the whole step (`StepNormaliser.denominator`)."""
        features, final_hidden = self.context_inputs(batch, sample_indices, stored)
        device = self.device
        target = None if final_hidden is None else self._target_rows(final_hidden, batch)
        with torch.no_grad():
            noise = self.embed_tokens(batch.noise_ids.to(device, non_blocking=True))
        # Checkpointed layers already recompute attention in backward; tiles need not again.
        layout = batch.layout(self.attention, False if self.config.gradient_checkpointing else None).to(device)
        with self.autocast():
            hidden = drafter(position_ids=batch.position_ids.to(device, non_blocking=True), attention_mask=layout,
                             noise_embedding=noise, target_hidden=features, block_ids=batch.noise_ids)  # fmt: skip
            num_sequences, num_anchors = batch.anchors.shape
            if self.dspark:
                return self._dspark_loss(drafter, hidden.view(num_sequences, num_anchors, self.config.block_size, -1), batch,
                                         denominator, target)
            hidden = hidden.view(num_sequences, num_anchors, self.config.block_size, -1)[:, :, 1:]
            return dflash_loss_from_hidden(
                hidden,
                lambda rows: self.drafter.compute_logits(rows, self.lm_head),
                batch.labels.to(device, non_blocking=True),
                batch.label_mask.to(device, non_blocking=True),
                self.weighting,
                keep=torch.nonzero(batch.label_mask.reshape(-1) > 0).squeeze(1),  # from the host batch: no device wait
                denominator=denominator, soft_targets=self.config.soft_targets, target=target,
            )

    def _target_rows(self, final_hidden: torch.Tensor, batch: BlockBatch) -> TargetRows:
        """Soft targets: prediction k of a block (its label at anchor+k) is scored against the target's
        distribution at anchor+k-1, the target's final-norm state there through its LM head (what its
        own logits are: `compute_logits` applies the target's output scaling and softcap)."""
        context_length = final_hidden.shape[1]
        offsets = torch.arange(self.predictions)
        # Past the sequence's end the label is masked; clamped, so the index stays in range.
        positions = (batch.anchors[..., None] + offsets).clamp(max=context_length - 1)
        index = positions + context_length * torch.arange(batch.anchors.shape[0])[:, None, None]
        return TargetRows(final_hidden.reshape(-1, final_hidden.shape[-1]), index,
                          lambda rows: self.drafter.compute_logits(rows, self.lm_head))  # fmt: skip

    def step_normaliser(self, micro_batches: list[BlockBatch]) -> StepNormaliser:
        """How this step's micro-batches enter the update; a global weighting counts the step's blocks
        over every rank first (one small all-reduce, no host sync on the device side)."""
        blocks = None
        if self.weighting.global_denominator:
            local = step_block_count(batch.label_mask for batch in micro_batches).to(self.device)
            blocks = all_reduce_sum(local, self.context)
        return StepNormaliser(self.weighting, len(micro_batches), self.context.world_size, blocks)


    def _dspark_loss(self, drafter, hidden: torch.Tensor, batch: BlockBatch, denominator: torch.Tensor | None = None,
                     target: TargetRows | None = None):
        """DSpark's loss of hidden [S, N, B, H]: position k scored with the Markov bias of the true
        token before its label (the anchor for k = 0: teacher forcing), plus the confidence head."""
        device = self.device
        anchors = batch.noise_ids.view(*batch.anchors.shape, -1)[:, :, :1]
        previous = torch.cat([anchors, batch.labels[:, :, :-1]], dim=-1)
        # The micro-batch's distinct previous tokens, found on the host (no device wait), are looked up
        # once: each scored chunk computes its Markov bias once per token it holds (`markov_logits_shared`).
        tokens, token_index = torch.unique(previous, return_inverse=True)
        inner = self.drafter
        table = inner.markov_embed(tokens.to(device, non_blocking=True))
        token_index_on_device = token_index.to(device, non_blocking=True)

        def score(rows: torch.Tensor, chunk_tokens: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
            base = inner.compute_logits(rows, self.lm_head)
            return inner.markov_logits_shared(base, F.embedding(chunk_tokens, table), inverse)

        return dspark_loss_from_hidden(
            hidden, score, batch.labels.to(device, non_blocking=True),
            batch.label_mask.to(device, non_blocking=True), self.weighting,
            confidence_logits=inner.confidence(hidden, F.embedding(token_index_on_device, table)),
            keep=torch.nonzero(batch.label_mask.reshape(-1) > 0).squeeze(1),
            denominator=denominator, previous=token_index, soft_targets=self.config.soft_targets, target=target,
        )  # fmt: skip


def check_drafter_options(config: TrainConfig) -> None:
    """--drafter dspark's own flags against the target, before anything loads (exit 2 naming the flag);
    a rank left out is filled in with the run's inputs (`open_run_inputs`)."""
    if config.drafter != "dspark" or config.markov_rank is None:
        return
    from draftsmith.model.target import load_target_config

    vocab = int(load_target_config(config.target).get_text_config().vocab_size)
    if not 1 <= config.markov_rank <= vocab:
        raise InputError(f"--markov-rank {config.markov_rank}: must be in 1..{vocab} (the target's vocabulary)")


def check_recipe_options(config: TrainConfig) -> None:
    """Loss and optimizer choices that cannot work together, before anything loads (exit 2 naming the flag)."""
    if config.optimizer == "muon" and config.sharding == "fsdp":
        raise InputError("--optimizer muon: --sharding fsdp is not supported yet (Muon on the sharded matrices has not been "
                         "shown equal to one process); use --sharding ddp")
    if config.soft_targets != "off" and config.offline_features is not None:
        from draftsmith.model.feature_store import FeatureStore
        from draftsmith.model.target import load_target_config

        last = int(load_target_config(config.target).get_text_config().num_hidden_layers) - 1
        layers = FeatureStore(config.offline_features).layer_ids
        if last not in layers:
            raise InputError(f"--soft-targets {config.soft_targets}: offline, the target's distribution comes from its last layer's "
                             f"stored feature, but {config.offline_features} holds layers {layers}, not {last}; extract with "
                             f"--target-layer-ids including {last}, or train online")


def build_optimizer(drafter: torch.nn.Module, config: TrainConfig, total_steps: int):
    """The optimizer `--optimizer` names (`optimizers.py`) over exactly the drafter's trainable parameters,
    and the cosine schedule every one of its groups follows."""
    from draftsmith.train.optimizers import make_optimizer

    optimizer = make_optimizer(drafter, config)
    warmup_steps = int(round(config.warmup_ratio * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_factory(total_steps, warmup_steps, config.min_lr_ratio))
    return optimizer, scheduler


def train_drafter(config: TrainConfig) -> TrainResult:
    """Train (or resume training) a drafter; the final checkpoint lands in `<out>/drafter`."""
    check_report_to(config.report_to)  # before anything is loaded or --out is made
    require_output_dir(config.out, "--out")
    check_drafter_options(config)
    check_recipe_options(config)
    context = init_distributed(config.device)
    try:
        # Every rank of one run writes --out; only the main rank holds its lock against other runs.
        with lock_directory(config.out, "train") if context.is_main else contextlib.nullcontext():
            return _train(config, context)
    finally:
        shutdown(context)


def _train(config: TrainConfig, context: DistributedContext) -> TrainResult:
    started, out_dir = time.perf_counter(), Path(config.out)
    run = open_run_inputs(config, context)
    config = run.config  # with what the inputs decide (the Markov rank of a resumed run)
    # The inputs are sound: the thread count (from the machine's load unless --threads) is said now.
    _, threads_line = choose_threads(config.num_threads, on_cpu=context.device.type == "cpu")
    if threads_line and context.is_main:
        print(f"train: {threads_line}", file=sys.stderr, flush=True)
    trainer = DrafterTrainer(config, context, run.dataset, template=run.template)
    model = parallelize_drafter(trainer.drafter, context, config.sharding)
    per_epoch = steps_per_epoch(len(run.trainable), context.world_size, config.batch_size, config.grad_accum)
    total_steps = min(per_epoch * config.epochs, config.max_steps or per_epoch * config.epochs)
    optimizer, scheduler = build_optimizer(trainer.drafter, config, total_steps)
    scaler = torch.amp.GradScaler(context.device.type, enabled=trainer.compute_dtype_name == "float16")
    state, metrics = TrainState(), MetricsAccumulator(trainer.predictions + 1, context.device)
    checkpointer = Checkpointer(out_dir, context, model, optimizer, {"train": state, "scheduler": scheduler, "metrics": metrics,
                                "scaler": scaler}, keep=config.keep_checkpoints, config=config.model_dump(mode="json"))  # fmt: skip
    resumed_from = checkpointer.restore(run.found) if run.found is not None else None
    run.found = None  # released: the optimizer holds its state now
    if resumed_from is not None and state.step >= total_steps:
        finished = _already_finished(out_dir, context, state.step, total_steps)
        if finished is not None:  # no step to take: rewriting the summary would only blank its metrics
            return finished
    if config.eval_prompts is not None:
        _keep_the_published_best(state, out_dir, context)
    _announce(config, context, trainer, run, total_steps, per_epoch, resumed_from)
    sampler = StepSampler(run.trainable, seed=config.seed, rank=context.rank, world_size=context.world_size,
                          batch_size=config.batch_size, grad_accum=config.grad_accum, epochs=config.epochs, total_steps=total_steps,
                          start_step=state.step, start_epoch=state.epoch, start_step_in_epoch=state.step_in_epoch)  # fmt: skip
    # Data workers are bounded by the steps to build and the CPUs, never what a typo asks for.
    workers = workers_for(config.data_workers, len(sampler), cpu_bound=True, at_least=0)
    loader = make_loader(trainer.source, sampler, workers=workers, device=context.device)
    evaluator = SpeculativeEval(config, trainer, run.template) if config.eval_prompts is not None and context.is_main else None
    deadline = None if config.max_minutes is None else time.perf_counter() + 60 * config.max_minutes
    stopped_by_time = False  # this run's own: a resumed run has its own deadline
    long_run = LongRunWarning("train", total_steps, "step", train_time_cuts(config, trainer.compute_dtype_name),
                              enabled=context.is_main and context.device.type == "cpu")
    with RunLog(config, context, out_dir, total_steps, state.step) as log:
        for step_batch in loader:
            _train_step(trainer, model, optimizer, scaler, metrics, step_batch, config.grad_clip, scheduler)
            state.finish_step(step_batch.epoch, step_batch.step_in_epoch, step_batch.last_in_epoch)
            long_run.observe(state.step)
            metrics.end_step(state.step, trainer.last_grad_norm, step_batch.num_tokens, step_batch.coverage_counts)
            log.progress.advance(1)
            log_due = state.step % config.log_every == 0 or state.step == total_steps
            save_due = state.step < total_steps and (
                state.step % config.save_every == 0 if config.save_every else step_batch.last_in_epoch
            )
            eval_due = config.eval_prompts is not None and (state.step % config.eval_every == 0 if config.eval_every else save_due)
            if log_due or save_due or eval_due:
                _sync(metrics, state, context, log, checkpointer, scheduler, report=log_due, fp16=scaler.is_enabled())
            if eval_due:
                _evaluate(evaluator, trainer, context, state, checkpointer, log)
            if save_due:
                _checkpoint(checkpointer, trainer.drafter, context, state.step)
            if log_due and deadline is not None and state.step < total_steps and _past(deadline, context):
                stopped_by_time = True
                if context.is_main:
                    print(f"train: stopped by --max-minutes {config.max_minutes:g} at step {state.step} of {total_steps}",
                          file=sys.stderr, flush=True)
                break
        _sync(metrics, state, context, log, checkpointer, scheduler, report=False, fp16=scaler.is_enabled())
        if config.eval_prompts is not None and state.last_eval_step != state.step:
            _evaluate(evaluator, trainer, context, state, checkpointer, log)
        if checkpointer.last_saved != state.step:
            _checkpoint(checkpointer, trainer.drafter, context, state.step)
    drafter_dir = checkpointer.publish_final(trainer.drafter_config, out_dir, FINAL_DIR)
    return _finish(config, context, trainer, state, log.last_record, metrics, drafter_dir, started, resumed_from,
                   stopped_by_time)


def train_time_cuts(config: TrainConfig, compute_dtype: str) -> list[str]:
    """The flags that cut a CPU training run, with this run's values (the long-run warning's hints)."""
    # Half the block halves the drafter's tokens per anchor; a block of 2 or 3 has no smaller one to suggest.
    cuts = [f"--block-size (now {config.block_size}; {config.block_size // 2} halves the drafter's tokens per anchor)"
            ] if config.block_size >= 4 else []
    cuts += [f"--num-anchors (now {config.num_anchors}; blocks per sequence)",
             f"--draft-layers (now {config.num_draft_layers})",
             "--max-steps or --epochs (now "
             + (f"{config.max_steps} steps" if config.max_steps else f"{config.epochs} epochs") + ")"]
    if config.offline_features is None:
        cuts.append("--offline FEATURES (draftsmith extract once: no target forward per step)")
    if compute_dtype != "bfloat16" and cpu_multiplies_bf16_natively():
        cuts.append("--dtype bf16 (this CPU multiplies bf16 natively)")
    return cuts


def _past(deadline: float, context: DistributedContext) -> bool:
    """Whether rank 0's clock is past the deadline; every rank gets the same answer, so all stop together."""
    return bool(broadcast_object(time.perf_counter() >= deadline if context.is_main else None, context))


def _already_finished(out_dir: Path, context: DistributedContext, step: int, total_steps: int) -> TrainResult | None:
    """The kept result of a run that already took all its steps (its train_summary.json), said on stderr;
    None when there is no readable summary (a run killed between its last checkpoint and the summary
    finishes normally, its metrics taken from train_log.jsonl)."""
    from draftsmith.core.readers import read_json

    try:
        summary = read_json(out_dir / "train_summary.json", "train summary", missing_ok=True)
        if not isinstance(summary, dict):
            return None
        fields = {key: summary[key] for key in TrainResult.__dataclass_fields__ if key in summary}
        for key in ("first_loss", "final_loss", "train_tau", "anchor_coverage"):  # strict JSON wrote NaN as null
            fields[key] = float("nan") if fields.get(key) is None else fields[key]
        result = TrainResult(**{**fields, "out_dir": Path(fields["out_dir"]), "drafter_dir": Path(fields["drafter_dir"]),
                                "losses": [tuple(item) for item in fields.get("losses", [])]})
    except (InputError, KeyError, TypeError):
        return None
    if not (out_dir / FINAL_DIR / "config.json").is_file():
        return None
    if context.is_main:
        print(f"train: the run in {out_dir} already finished (step {step} of {total_steps}); nothing to resume, "
              "its train_summary.json is kept (raise --epochs or --max-steps to train further)", file=sys.stderr, flush=True)
    result.extra = {**result.extra, "already_finished": True}
    return result


def _last_logged_metrics(path: Path) -> dict:
    """The last step record of `train_log.jsonl` that carries metrics (eval records do not), or {}."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "train_tau" in record and "acc_by_offset" in record:
            return record
    return {}


def _train_step(trainer: DrafterTrainer, model, optimizer, scaler, metrics: MetricsAccumulator, step_batch: StepBatch,
                grad_clip: float, scheduler=None) -> None:  # fmt: skip
    """Forward and backward over the step's micro-batches, clip, optimizer and schedule step; no host
    sync (but fp16's scaler, which skips a step whose gradients overflowed)."""
    optimizer.zero_grad(set_to_none=True)
    count = len(step_batch.micro_batches)
    stored = step_batch.features or [None] * count
    normaliser = trainer.step_normaliser(step_batch.micro_batches)
    for index, (batch, sample_indices) in enumerate(zip(step_batch.micro_batches, step_batch.sample_indices, strict=True)):
        with gradient_sync(model, index == count - 1):
            output = trainer.forward_batch(model, batch, sample_indices, stored[index], normaliser.denominator)
            scaler.scale(normaliser.backward_term(output.loss)).backward()
        metrics.add_micro_batch(output, normaliser.share(output.loss))
    scaler.unscale_(optimizer)
    trainer.last_grad_norm = clip_gradients(trainer.drafter.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    if scheduler is not None:
        with warnings.catch_warnings():  # a step the scaler skipped is still a step of the schedule
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
            scheduler.step()


def _evaluate(evaluator: SpeculativeEval | None, trainer, context, state: TrainState, checkpointer: Checkpointer, log: RunLog) -> None:
    """Speculative tau on the eval prompts (rank 0 decodes, the others wait), logged; a new best is
    published as `<out>/drafter-best` (collective) before the checkpoint of the step records it."""
    result = broadcast_object(evaluator.run() if evaluator is not None else None, context)
    improved = state.best_eval_tau is None or result["eval_tau"] > state.best_eval_tau
    state.last_eval_step = state.step
    if improved:
        state.best_eval_tau, state.best_eval_step = result["eval_tau"], state.step
        checkpointer.publish_final(trainer.drafter_config, log.path.parent, BEST_DIR,
                                   record={"eval_tau": state.best_eval_tau, "step": state.best_eval_step})
    log.write_eval(state.step, {**result, "best_eval_tau": state.best_eval_tau, "best_eval_step": state.best_eval_step})


def _keep_the_published_best(state: TrainState, out_dir: Path, context) -> None:
    """Start from the better of the checkpoint's best tau and the drafter-best on disk (the same on every rank)."""
    published = broadcast_object(published_best(out_dir) if context.is_main else None, context)
    if published is not None and (state.best_eval_tau is None or published[0] > state.best_eval_tau):
        state.best_eval_tau, state.best_eval_step = published


def _checkpoint(checkpointer: Checkpointer, drafter, context, step: int) -> None:
    """Save the checkpoint of `step` unless a parameter went non-finite (one device check, all ranks)."""
    bad = torch.zeros((), dtype=torch.float64, device=context.device)
    for parameter in drafter.parameters():
        local = parameter.detach()
        local = local.to_local() if hasattr(local, "to_local") else local  # an FSDP2 shard
        bad += (~torch.isfinite(local)).sum()
    if float(all_reduce_sum(bad, context)) > 0:
        raise TrainingDiverged(_diverged_message(f"non-finite drafter parameters after step {step}", checkpointer.last_saved))
    checkpointer.save(step)


def _diverged_message(what: str, kept: int | None) -> str:
    return (
        f"training diverged: {what} (lower --lr or keep --grad-clip on); stopped, "
        + (f"the last good checkpoint is {CHECKPOINT_DIR}/step-{kept:08d}" if kept else "no checkpoint was written")
        + "; no drafter was written"
    )


def _sync(metrics, state: TrainState, context, log: RunLog, checkpointer: Checkpointer, scheduler, *, report: bool,
          fp16: bool) -> None:  # fmt: skip
    """Bring the pending steps to the host (reduced over ranks); stop on the first non-finite one."""
    synced = metrics.sync(context)
    # Under fp16 the scaler skips steps whose gradients overflowed; only the loss can diverge there.
    bad = first_nonfinite([item._replace(grad_norm=0.0) if fp16 else item for item in synced])
    if bad is not None:
        raise TrainingDiverged(_diverged_message(f"{bad[1]} at step {bad[0]}", checkpointer.last_saved))
    for item in synced:
        state.losses.append((item.step, item.loss))
        state.tokens_seen += item.tokens
        state.covered_tokens += item.covered_tokens
        state.trainable_tokens += item.trainable_tokens
    log.steps_done(synced)
    if report and synced:
        log.write(state, metrics.report(context), scheduler.get_last_lr()[0], synced[-1].grad_norm)


def _announce(config, context, trainer, run: RunInputs, total_steps: int, per_epoch: int, resumed_from: int | None) -> None:
    if not context.is_main:
        return
    out_dir = Path(config.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "train_config.json", json.dumps(config.model_dump(mode="json"), indent=1))
    mode = "offline" if config.offline_features else "online"
    print(
        f"training a {config.num_draft_layers}-layer drafter (block {config.block_size}, {_weighting_words(config, trainer)}, "
        f"layers {trainer.layer_ids}, {mode}, {trainer.compute_dtype_name}, {trainer.attention} attention) on {len(run.trainable)} samples "
        f"x {config.epochs} epochs = {total_steps} steps"
        + (" (capped by max_steps)" if total_steps < per_epoch * config.epochs else "")
        + f", {context.world_size} process(es)" + (f", {config.sharding}" if context.enabled else "")
        + (f"; resuming at step {resumed_from}" if resumed_from is not None else ""),
        file=sys.stderr,
    )


def _weighting_words(config, trainer) -> str:
    words = f"D-PACE weights alpha {config.dpace_alpha:g}" if config.loss_weights == "dpace" else f"gamma {trainer.gamma:g}"
    if config.soft_targets != "off":
        words += f", soft targets {config.soft_targets}"
    return words + (", Muon + AdamW" if config.optimizer == "muon" else "")


class RunLog:
    """`train_log.jsonl` (cut back to the resumed step), the reporter, the progress bar and log lines: rank 0 only."""

    def __init__(self, config: TrainConfig, context: DistributedContext, out_dir: Path, total_steps: int, step: int):
        self.config, self.total_steps, self.main = config, total_steps, context.is_main
        self.path = Path(out_dir) / LOG_FILE
        self.last_record: dict = {}
        self.window_start, self.window_tokens = time.perf_counter(), 0
        self.window_covered = self.window_trainable = 0
        if self.main:
            cut_log(self.path, step)  # records past the checkpoint would repeat
            # A resumed run that takes no further step reports the metrics logged before its checkpoint.
            self.last_record = _last_logged_metrics(self.path) if step else {}
        self.handle = open_append(self.path) if self.main else None
        self.reporter = make_reporter(config.report_to if self.main else "none", out_dir, config.model_dump(mode="json"))
        self.progress = Progress("train", total_steps, unit="steps", token_unit="tok", enabled=config.progress and self.main,
                                 completed=step)  # fmt: skip

    def __enter__(self) -> RunLog:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(None, None, None)
        self.reporter.close()
        if self.handle is not None:
            self.handle.close()

    def steps_done(self, synced: list) -> None:
        tokens = sum(item.tokens for item in synced)
        self.window_tokens += tokens
        self.window_covered += sum(item.covered_tokens for item in synced)
        self.window_trainable += sum(item.trainable_tokens for item in synced)
        if synced:
            self.progress.advance(0, tokens=tokens, loss=f"{synced[-1][1]:.4f}")

    def write_eval(self, step: int, result: dict) -> None:
        """An eval point's own record in the log (`step` and the `eval_*` numbers), and its line."""
        if not self.main:
            return
        record = {"step": step, **result, "time": round(time.time(), 3)}  # time: for `draftsmith status`
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()
        self.reporter.log(step, record)
        print(f"step {step} eval: speculative tau {result['eval_tau']:.2f} over {result['eval_cycles']} cycles "
              f"(best {result['best_eval_tau']:.2f} at step {result['best_eval_step']})", file=sys.stderr, flush=True)  # fmt: skip

    def write(self, state: TrainState, window: dict, lr: float, grad_norm: float) -> None:
        elapsed = time.perf_counter() - self.window_start
        record = {"step": state.step, "epoch": state.epoch if state.step_in_epoch else state.epoch - 1, "loss": window["loss"],
                  "lr": lr, "grad_norm": grad_norm, "tokens_per_s": self.window_tokens / max(elapsed, 1e-9),
                  "acc_by_offset": window["acc_by_offset"], "train_tau": window["train_tau"],
                  "anchor_coverage": round(self.window_covered / max(self.window_trainable, 1), 4),
                  "total_steps": self.total_steps, "time": round(time.time(), 3)}  # fmt: skip  # the last two: for `status`
        self.last_record = record
        self.window_start, self.window_tokens = time.perf_counter(), 0
        self.window_covered = self.window_trainable = 0
        if not self.main:
            return
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()
        self.reporter.log(state.step, record)
        self.progress.update(acc=f"{record['acc_by_offset'][0]:.3f}" if record["acc_by_offset"] else "-")
        if not self.config.progress:
            print(f"step {state.step}/{self.total_steps} loss {record['loss']:.4f} acc@1 {record['acc_by_offset'][0]:.3f} "
                  f"tau~{record['train_tau']:.2f} anchor coverage {record['anchor_coverage']:.1%} "
                  f"{record['tokens_per_s']:,.0f} tok/s", file=sys.stderr, flush=True)  # fmt: skip


def _finish(config, context, trainer, state: TrainState, last_record: dict, metrics, drafter_dir: Path, started: float,
            resumed_from: int | None, stopped_by_time: bool = False) -> TrainResult:  # fmt: skip
    checksums = gather_floats(parameter_checksum(trainer.drafter), context)
    window = metrics.report(context)
    if window["loss"] == window["loss"]:  # steps after the last log point
        last_record = window
    elapsed = time.perf_counter() - started
    losses = state.losses
    result = TrainResult(
        out_dir=Path(config.out), drafter_dir=drafter_dir, steps=state.step, epochs=state.epoch, losses=losses,
        first_loss=losses[0][1] if losses else float("nan"),
        final_loss=float(np.mean([loss for _, loss in losses[-max(1, min(10, len(losses))) :]])) if losses else float("nan"),
        tokens_seen=state.tokens_seen, elapsed_s=elapsed, tokens_per_s=state.tokens_seen / max(elapsed, 1e-9),
        accuracy_by_offset=list(last_record.get("acc_by_offset", [])),
        train_tau=float(last_record.get("train_tau", float("nan"))), rank_checksums=checksums,
        world_size=context.world_size, resumed_from_step=resumed_from, anchor_coverage=state.anchor_coverage,
        extra={"sharding": config.sharding if context.enabled else "none",
               **({"stopped_by_max_minutes": True} if stopped_by_time else {}),
               **({"best_eval_tau": state.best_eval_tau, "best_eval_step": state.best_eval_step} if config.eval_prompts else {})},
    )  # fmt: skip
    if context.is_main:
        write_json_atomic(Path(config.out) / "train_summary.json", result.to_dict(), indent=1)
    return result


# Kept importable for callers of the earlier layout.
__all__ = ["CHECKPOINT_DIR", "FINAL_DIR", "LOG_FILE", "MANIFEST_NAME", "DrafterTrainer", "TrainConfig", "TrainResult",
           "build_optimizer", "check_manifest", "newest_intact_checkpoint", "resume_settings", "train_drafter"]  # fmt: skip
