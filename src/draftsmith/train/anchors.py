"""Anchor sampling: where draft blocks start during training.

An anchor plays the role of the last committed token at inference (the target's bonus token): the
block is [token at anchor, MASK x (B-1)] and predicts the tokens after it. At inference the anchor is
always a generated token, so anchors are sampled among response (loss-mask) positions, and only
where the first prediction, anchor+1, is a response token too; an anchor near the end of a sequence
is allowed, its labels past the end are masked out of the loss.
"""

from __future__ import annotations

import torch


def valid_anchor_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions a with loss_mask[a] == 1 and loss_mask[a+1] == 1 (1-D mask in, sorted long tensor out)."""
    mask = torch.as_tensor(loss_mask).bool().flatten()
    if mask.numel() < 2:
        return torch.zeros(0, dtype=torch.long)
    valid = mask[:-1] & mask[1:]
    return torch.nonzero(valid, as_tuple=False).flatten()


def anchor_generator(seed: int, epoch: int, sample_index: int) -> torch.Generator:
    """A generator owned by one (epoch, sample): anchors are the same whoever draws them and whenever.

    That is what makes resume exact and lets online and offline training see the same blocks.
    """
    generator = torch.Generator()
    generator.manual_seed((seed * 1_000_003 + epoch) * 1_000_000_007 + sample_index)
    return generator


def sample_anchors(loss_mask: torch.Tensor, max_anchors: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Up to `max_anchors` distinct anchors drawn uniformly among the valid positions, sorted."""
    candidates = valid_anchor_positions(loss_mask)
    if candidates.numel() <= max_anchors:
        return candidates
    chosen = torch.randperm(candidates.numel(), generator=generator)[:max_anchors]
    return candidates[chosen].sort().values
