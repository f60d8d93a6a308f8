"""Draft blocks for training and the attention mask that keeps them honest.

For one sequence of T tokens and N anchors a_0 < ... < a_{N-1}, the drafter's query sequence is the
N blocks side by side (N*B positions), block i = [x[a_i], MASK x (B-1)] at positions a_i..a_i+B-1.
Keys/values are [context (T target features) | the N*B block positions]. Block i may see:
  - context positions p < a_i (strictly): at inference the anchor is the bonus token the target has
    not processed yet, so its own feature is not in the drafter's context (SpecForge does the same);
  - its own B positions, in both directions;
  - nothing of any other block.
Sequences of a batch are padded to the longest context and the most anchors; a padding block sees
only itself (never an empty row, which would turn softmax into NaN) and carries no loss.
The rules live in `draftsmith.model.block_attention`; a batch hands the drafter a `BlockLayout`
(anchors, no mask) and builds the dense mask only when the dense reference path asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.model.block_attention import BlockLayout


@dataclass
class BlockBatch:
    """Everything the drafter needs for one micro-batch, padded over sequences."""

    context_ids: torch.Tensor  # [S, T] long (padded with 0)
    context_mask: torch.Tensor  # [S, T] long: 1 = real token (for the target forward)
    noise_ids: torch.Tensor  # [S, N*B] long
    position_ids: torch.Tensor  # [S, T + N*B] long
    labels: torch.Tensor  # [S, N, B-1] long: token at anchor+k, k = 1..B-1 ([S, N, B], k = 1..B, from the anchor)
    label_mask: torch.Tensor  # [S, N, B-1] float: 1 where the label is a response token in range ([S, N, B] likewise)
    anchors: torch.Tensor  # [S, N] long (padding anchors are 0)
    anchor_valid: torch.Tensor  # [S, N] bool
    num_tokens: int  # real context tokens in the micro-batch
    # Anchor coverage: the sequences' trainable (loss-mask) tokens, and how many of them some block
    # predicts (a label of an anchor's block); their ratio is the run's anchor coverage.
    trainable_tokens: int = 0
    covered_tokens: int = 0

    _TENSORS = ("context_ids", "context_mask", "noise_ids", "position_ids", "labels", "label_mask", "anchors", "anchor_valid")

    def pin_memory(self) -> BlockBatch:
        """A copy in page-locked memory, so `to(cuda, non_blocking=True)` overlaps with compute."""
        return self._map(lambda tensor: tensor.pin_memory())

    def to(self, device: torch.device, non_blocking: bool = False) -> BlockBatch:
        return self._map(lambda tensor: tensor.to(device, non_blocking=non_blocking))

    def _map(self, fn) -> BlockBatch:
        return BlockBatch(**{name: fn(getattr(self, name)) for name in self._TENSORS}, num_tokens=self.num_tokens,
                          trainable_tokens=self.trainable_tokens, covered_tokens=self.covered_tokens)

    @property
    def block_size(self) -> int:
        return self.noise_ids.shape[1] // self.anchors.shape[1]

    def layout(self, mode: str = "sparse", recompute_tiles: bool | None = None) -> BlockLayout:
        """The drafter's attention input: which blocks see what, computed by `mode`."""
        return BlockLayout(
            self.anchors, self.anchor_valid, self.context_ids.shape[1], self.block_size, mode=mode, recompute_tiles=recompute_tiles
        )

    @property
    def attention_mask(self) -> torch.Tensor:
        """Dense boolean mask [S, 1, N*B, T + N*B] (True = may attend), built on demand."""
        return self.layout("dense").dense_mask()


def block_attention_mask(
    anchors: torch.Tensor, anchor_valid: torch.Tensor, context_length: int, block_size: int
) -> torch.Tensor:
    """Boolean mask [S, 1, N*B, T + N*B] with the visibility rules of the module docstring."""
    return BlockLayout(anchors, anchor_valid, context_length, block_size, mode="dense").dense_mask()


def build_block_batch(
    sequences: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    block_size: int,
    mask_token_id: int,
    from_anchor: bool = False,
) -> BlockBatch:
    """Build blocks, labels and masks for sequences given as (input_ids, loss_mask, anchors).

    `from_anchor` (DSpark): every block position predicts the next token, so the labels are the
    tokens at anchor+1..anchor+B (B of them) instead of anchor+1..anchor+B-1."""
    if block_size < 2:
        raise ValueError("block_size must be at least 2")
    num_sequences = len(sequences)
    context_length = max(int(ids.numel()) for ids, _, _ in sequences)
    num_anchors = max(1, max(int(anchors.numel()) for _, _, anchors in sequences))
    offsets = torch.arange(block_size)
    label_offsets = torch.arange(1, block_size + 1 if from_anchor else block_size)

    context_ids = torch.zeros((num_sequences, context_length), dtype=torch.long)
    context_mask = torch.zeros((num_sequences, context_length), dtype=torch.long)
    anchors_padded = torch.zeros((num_sequences, num_anchors), dtype=torch.long)
    anchor_valid = torch.zeros((num_sequences, num_anchors), dtype=torch.bool)
    labels = torch.zeros((num_sequences, num_anchors, label_offsets.numel()), dtype=torch.long)
    label_mask = torch.zeros((num_sequences, num_anchors, label_offsets.numel()), dtype=torch.float32)
    noise_ids = torch.full((num_sequences, num_anchors, block_size), mask_token_id, dtype=torch.long)

    num_tokens = trainable_tokens = covered_tokens = 0
    for row, (input_ids, loss_mask, anchors) in enumerate(sequences):
        input_ids = torch.as_tensor(input_ids, dtype=torch.long).flatten()
        loss_mask = torch.as_tensor(loss_mask).flatten().float()
        anchors = torch.as_tensor(anchors, dtype=torch.long).flatten()
        length = input_ids.numel()
        num_tokens += length
        context_ids[row, :length] = input_ids
        context_mask[row, :length] = 1
        trainable_tokens += int(loss_mask[:length].sum())
        count = anchors.numel()
        if count == 0:
            continue
        if int(anchors.max()) >= length or int(anchors.min()) < 0:
            raise ValueError("anchor outside its sequence")
        anchors_padded[row, :count] = anchors
        anchor_valid[row, :count] = True
        noise_ids[row, :count, 0] = input_ids[anchors]
        label_positions = anchors[:, None] + label_offsets[None, :]  # [n, B-1] (or [n, B])
        in_range = label_positions < length
        safe = label_positions.clamp(max=length - 1)
        labels[row, :count] = torch.where(in_range, input_ids[safe], torch.zeros_like(safe))
        label_mask[row, :count] = loss_mask[safe] * in_range.float()
        covered = torch.zeros(length, dtype=torch.bool)
        covered[label_positions[in_range]] = True
        covered_tokens += int((covered & (loss_mask[:length] > 0)).sum())

    block_positions = (anchors_padded[:, :, None] + offsets[None, None, :]).reshape(num_sequences, -1)
    context_positions = torch.arange(context_length).expand(num_sequences, -1)
    return BlockBatch(
        context_ids=context_ids,
        context_mask=context_mask,
        noise_ids=noise_ids.reshape(num_sequences, -1),
        position_ids=torch.cat([context_positions, block_positions], dim=1),
        labels=labels,
        label_mask=label_mask,
        anchors=anchors_padded,
        anchor_valid=anchor_valid,
        num_tokens=num_tokens,
        trainable_tokens=trainable_tokens,
        covered_tokens=covered_tokens,
    )
