"""The input pipeline: which samples each rank trains on, in which order, built by DataLoader workers.

Order. Each epoch is a seeded permutation of the trainable samples (a numpy array, never a list of
Python objects), padded by wrapping so that every rank gets the same number of micro-batches, and
split round-robin over ranks. A step is `grad_accum` consecutive micro-batches of `batch_size`
samples; the last step of an epoch may hold fewer.

Exact resume. `StepSampler` starts at a (epoch, step in epoch) position and yields one step
descriptor at a time; what a descriptor becomes (anchors from (seed, epoch, sample), blocks, labels)
depends only on the descriptor, so a resumed run, any number of workers and any prefetch depth
see exactly the micro-batches an uninterrupted run would.

Loading. `StepSource` turns a descriptor into a `StepBatch` of `BlockBatch`es inside the
DataLoader's workers; the loader pins it (only on CUDA) and prefetches the next steps while the
current one trains.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from draftsmith.train.anchors import anchor_generator, sample_anchors
from draftsmith.train.blocks import BlockBatch, build_block_batch


def trainable_indices(dataset) -> np.ndarray:
    """Indices of the samples with at least one valid anchor (two consecutive loss-mask tokens).

    Vectorised over the memory-mapped shards (`trainable_pairs`): no Python object per sample, so
    start-up time and resident memory do not grow with a Python loop over 914k samples."""
    pairs = getattr(dataset, "trainable_pairs", None)
    if pairs is not None:
        return np.flatnonzero(pairs() > 0).astype(np.int64)
    keep = [index for index, sample in enumerate(dataset) if _has_pair(np.asarray(sample.loss_mask))]
    return np.asarray(keep, dtype=np.int64)


def _has_pair(mask: np.ndarray) -> bool:
    return mask.shape[0] >= 2 and bool(np.any((mask[:-1] != 0) & (mask[1:] != 0)))


def epoch_order(num_samples: int, seed: int, epoch: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
    """This rank's positions (into the trainable samples) for an epoch; the same length on every rank."""
    generator = torch.Generator()
    generator.manual_seed(seed * 7919 + epoch)
    order = torch.randperm(num_samples, generator=generator).numpy()
    per_rank = math.ceil(num_samples / world_size)
    return np.resize(order, per_rank * world_size)[rank::world_size]


def micro_batches_per_epoch(num_samples: int, world_size: int, batch_size: int) -> int:
    return math.ceil(math.ceil(num_samples / world_size) / batch_size)


def steps_per_epoch(num_samples: int, world_size: int, batch_size: int, grad_accum: int) -> int:
    return math.ceil(micro_batches_per_epoch(num_samples, world_size, batch_size) / grad_accum)


@dataclass(frozen=True)
class StepDescriptor:
    """One optimizer step of one rank: its place in the run and the sample indices of each micro-batch."""

    epoch: int
    step_in_epoch: int
    last_in_epoch: bool
    micro_batches: tuple[np.ndarray, ...]


class StepSampler:
    """Step descriptors from (start_epoch, start_step_in_epoch) until `epochs` or `total_steps` (global)."""

    def __init__(self, trainable: np.ndarray, *, seed: int, rank: int, world_size: int, batch_size: int,
                 grad_accum: int, epochs: int, total_steps: int, start_step: int = 0, start_epoch: int = 0,
                 start_step_in_epoch: int = 0):  # fmt: skip
        self.trainable = trainable
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batch_size, self.grad_accum = batch_size, grad_accum
        self.epochs, self.total_steps = epochs, total_steps
        self.start = (start_step, start_epoch, start_step_in_epoch)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """This rank's sample indices of an epoch, in order (one int64 array, nothing per sample)."""
        return self.trainable[epoch_order(len(self.trainable), self.seed, epoch, self.rank, self.world_size)]

    def epoch_steps(self, epoch: int) -> list[tuple[np.ndarray, ...]]:
        order = self.epoch_order(epoch)
        return [self._step(order, index) for index in range(self._steps_in(order))]

    def _steps_in(self, order: np.ndarray) -> int:
        return math.ceil(math.ceil(len(order) / self.batch_size) / self.grad_accum)

    def _step(self, order: np.ndarray, index: int) -> tuple[np.ndarray, ...]:
        first = index * self.grad_accum * self.batch_size
        end = min(len(order), first + self.grad_accum * self.batch_size)
        return tuple(order[start : min(end, start + self.batch_size)] for start in range(first, end, self.batch_size))

    def __iter__(self) -> Iterator[StepDescriptor]:
        step, epoch, step_in_epoch = self.start
        while epoch < self.epochs and step < self.total_steps:
            order = self.epoch_order(epoch)
            count = self._steps_in(order)
            for index in range(step_in_epoch, count):
                if step >= self.total_steps:
                    return
                yield StepDescriptor(epoch, index, index == count - 1, self._step(order, index))
                step += 1
            epoch, step_in_epoch = epoch + 1, 0

    def __len__(self) -> int:
        step, epoch, step_in_epoch = self.start
        per_epoch = steps_per_epoch(len(self.trainable), self.world_size, self.batch_size, self.grad_accum)
        return max(0, min(self.total_steps - step, per_epoch * (self.epochs - epoch) - step_in_epoch))


@dataclass
class StepBatch:
    """What one optimizer step of one rank trains on."""

    epoch: int
    step_in_epoch: int
    last_in_epoch: bool
    sample_indices: list[list[int]]
    micro_batches: list[BlockBatch]
    # Offline training: each micro-batch's stored context features [S, T, H] (their stored dtype,
    # zero past each sequence), read by the workers ahead of the step; None online.
    features: list[torch.Tensor | None] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(batch.num_tokens for batch in self.micro_batches)

    @property
    def coverage_counts(self) -> tuple[int, int]:
        """(trainable tokens some block predicts, trainable tokens) of the step's sequences."""
        return (sum(batch.covered_tokens for batch in self.micro_batches),
                sum(batch.trainable_tokens for batch in self.micro_batches))

    def pin_memory(self) -> StepBatch:  # called by the DataLoader's pin-memory thread
        self.micro_batches = [batch.pin_memory() for batch in self.micro_batches]
        if self.features is not None:
            self.features = [None if item is None else item.pin_memory() for item in self.features]
        return self


class StepSource:
    """Map-style source for the DataLoader: a `StepDescriptor` in, a `StepBatch` out (runs in workers)."""

    def __init__(self, dataset, *, seed: int, num_anchors: int, block_size: int, mask_token_id: int, features=None,
                 from_anchor: bool = False):  # fmt: skip
        self.dataset = dataset
        self.from_anchor = from_anchor  # DSpark's labels: every block position predicts the next token
        self.seed, self.num_anchors = seed, num_anchors
        self.block_size, self.mask_token_id = block_size, mask_token_id
        self.features = features  # a FeatureStore (offline training) or None

    def stored_features(self, sample_indices, context_length: int) -> torch.Tensor:
        """The offline features of these samples as one [S, context_length, H] tensor, zero-padded."""
        samples = [(index, self.dataset[index]) for index in (int(value) for value in sample_indices)]
        rows = [self.features.get(index, sample.id, sample.input_ids) for index, sample in samples]
        stacked = torch.zeros((len(rows), context_length, rows[0].shape[-1]), dtype=rows[0].dtype)
        for row, features in enumerate(rows):
            stacked[row, : features.shape[0]] = features
        return stacked

    def anchors_for(self, sample_index: int, epoch: int) -> torch.Tensor:
        mask = torch.from_numpy(np.asarray(self.dataset[sample_index].loss_mask))
        return sample_anchors(mask, self.num_anchors, anchor_generator(self.seed, epoch, sample_index))

    def block_batch(self, sample_indices, epoch: int) -> BlockBatch:
        sequences = []
        for index in (int(value) for value in sample_indices):
            sample = self.dataset[index]
            ids = torch.from_numpy(np.asarray(sample.input_ids, dtype=np.int64))
            sequences.append((ids, torch.from_numpy(np.asarray(sample.loss_mask)), self.anchors_for(index, epoch)))
        return build_block_batch(sequences, self.block_size, self.mask_token_id, from_anchor=self.from_anchor)

    def __getitem__(self, step: StepDescriptor) -> StepBatch:
        batches = [self.block_batch(micro, step.epoch) for micro in step.micro_batches]
        features = None
        if self.features is not None:
            features = [self.stored_features(micro, batch.context_ids.shape[1]) for micro, batch in zip(step.micro_batches, batches)]
        return StepBatch(
            epoch=step.epoch,
            step_in_epoch=step.step_in_epoch,
            last_in_epoch=step.last_in_epoch,
            sample_indices=[[int(value) for value in micro] for micro in step.micro_batches],
            micro_batches=batches,
            features=features,
        )

    def __len__(self) -> int:  # DataLoader asks; a sampler decides what is read
        return len(self.dataset)


def _keep(item):
    return item


def make_loader(source: StepSource, sampler: StepSampler, *, workers: int, device: torch.device, prefetch: int = 2):
    """A DataLoader over whole steps: `workers` processes, pinned memory on CUDA, `prefetch` steps ahead each."""
    from torch.utils.data import DataLoader

    return DataLoader(
        source,
        sampler=sampler,
        batch_size=None,
        collate_fn=_keep,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        prefetch_factor=prefetch if workers > 0 else None,
        persistent_workers=False,
    )

