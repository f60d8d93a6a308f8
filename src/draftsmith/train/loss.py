"""The DFlash training loss: position-weighted cross-entropy over each block's predictions.

Block offset k = 1..B-1 predicts the token at anchor+k (no shift: the hidden state at block
position k is read out for the token at that position). Offsets whose label is not a response token
or lies past the end of the sequence are masked. Early offsets matter more, because a draft is
accepted only up to its first mistake: w_k = exp(-(k-1)/gamma). The loss is sum(w*CE)/sum(w) over
every unmasked prediction of the micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# The paper's decay for its block sizes; other sizes fall back to (B-1)/2, which sits between them.
DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    return DEFAULT_GAMMA.get(block_size, max(1.0, (block_size - 1) / 2))


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for k = 1..B-1, as a float tensor of length B-1."""
    gamma = default_gamma(block_size) if gamma is None else gamma
    if gamma <= 0:
        raise ValueError("gamma must be positive")
    k = torch.arange(1, block_size, dtype=torch.float64)
    return torch.exp(-(k - 1) / gamma).float()


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    weighted_ce_sum: torch.Tensor  # sum(w * CE), detached
    weight_sum: torch.Tensor  # sum(w), detached
    correct: torch.Tensor  # [B-1] greedy-correct predictions per offset, detached
    counted: torch.Tensor  # [B-1] unmasked predictions per offset
    accepted_prefix: torch.Tensor  # [] sum over blocks of the correct-prefix length (tau - 1)
    blocks: torch.Tensor  # [] number of blocks with at least one label


def _weighted_loss(ce: torch.Tensor, hit: torch.Tensor, label_mask: torch.Tensor, weights: torch.Tensor) -> LossOutput:
    """The weighted loss and its statistics from per-prediction CE and greedy hits [..., B-1]."""
    full_weights = label_mask * weights.to(label_mask.device)
    weighted_ce_sum = (ce * full_weights).sum()
    weight_sum = full_weights.sum()
    loss = weighted_ce_sum / weight_sum.clamp_min(1e-12)
    with torch.no_grad():
        hit = hit * label_mask
        reduce_dims = tuple(range(hit.dim() - 1))
        # A block drafts correctly up to its first miss; masked offsets end the prefix as well.
        prefix = torch.cumprod(hit, dim=-1).sum(-1)
        has_labels = label_mask[..., 0] > 0
        return LossOutput(
            loss=loss,
            weighted_ce_sum=weighted_ce_sum.detach(),
            weight_sum=weight_sum.detach(),
            correct=hit.sum(reduce_dims),
            counted=label_mask.sum(reduce_dims),
            accepted_prefix=(prefix * has_labels).sum(),
            blocks=has_labels.sum(),
        )


def dflash_loss(
    logits: torch.Tensor, labels: torch.Tensor, label_mask: torch.Tensor, weights: torch.Tensor
) -> LossOutput:
    """logits [..., B-1, V], labels/label_mask [..., B-1], weights [B-1]."""
    vocab = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, vocab).float(), labels.reshape(-1), reduction="none").view(labels.shape)
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels).float()
    return _weighted_loss(ce, hit, label_mask, weights)


def expected_weight_sum(block_size: int, gamma: float | None = None) -> float:
    """sum_k w_k for a block with every label present (for sanity checks and docs)."""
    gamma = default_gamma(block_size) if gamma is None else gamma
    return sum(math.exp(-(k - 1) / gamma) for k in range(1, block_size))


# Rows scored at once: at a 152k vocabulary 1,024 rows are ~0.6 GB of fp32 logits (and as much
# again for their gradient in backward), whatever the number of blocks in the micro-batch.
DEFAULT_CHUNK_ROWS = 1024


def dflash_loss_from_hidden(
    hidden: torch.Tensor,
    score,
    labels: torch.Tensor,
    label_mask: torch.Tensor,
    weights: torch.Tensor,
    chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
    keep: torch.Tensor | None = None,
) -> LossOutput:
    """`dflash_loss` computed from hidden states [..., B-1, H], scoring only the unmasked predictions.

    With a real vocabulary (150k+) the logits of every block position dominate memory; padding
    blocks, prompt labels and labels past the end carry no loss, so they are never scored. The rest
    are scored `chunk_rows` at a time and each chunk's logits are recomputed in backward rather than
    kept (`None`: all rows in one pass, as a reference), so at most one chunk's logits are alive.
    `score` maps [M, H] hidden states to [M, V] logits (the target's frozen lm_head).

    `keep`: the flat indices of the unmasked predictions (`nonzero(label_mask.flatten())`) when the
    caller has them on the host already: the trainer takes them from the CPU batch, so selecting
    the rows never waits on the device. Without it they are computed here (a sync on a GPU).
    """
    if keep is None:
        keep = torch.nonzero(label_mask.reshape(-1) > 0).squeeze(1)
    keep = keep.to(hidden.device, non_blocking=True)
    rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep)
    ce_selected, hit_selected = chunked_cross_entropy(rows, labels.reshape(-1).index_select(0, keep), score, chunk_rows)
    ce = torch.zeros(labels.numel(), dtype=ce_selected.dtype, device=ce_selected.device).index_put((keep,), ce_selected)
    with torch.no_grad():
        hit = torch.zeros(labels.numel(), dtype=torch.float32, device=labels.device).index_put((keep,), hit_selected)
    return _weighted_loss(ce.view(labels.shape), hit.view(labels.shape), label_mask, weights)


def _score_rows(rows: torch.Tensor, row_labels: torch.Tensor, score) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cross-entropy and greedy hits of one chunk of rows; its logits die with the call."""
    logits = score(rows)
    ce = F.cross_entropy(logits.float(), row_labels, reduction="none")
    hit = (logits.detach().argmax(-1) == row_labels).float()
    return ce, hit


def chunked_cross_entropy(
    rows: torch.Tensor, row_labels: torch.Tensor, score, chunk_rows: int | None = DEFAULT_CHUNK_ROWS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row CE [M] (differentiable) and greedy hits [M] of `score(rows)` against `row_labels`.

    Each chunk runs under `torch.utils.checkpoint`: forward keeps only the chunk's inputs, and
    backward recomputes the chunk's logits (same autocast state) to form their gradient, one chunk at
    a time. The values and gradients equal the one-pass computation.
    """
    from torch.utils.checkpoint import checkpoint

    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError("chunk_rows must be at least 1")
    if chunk_rows is None or rows.shape[0] <= chunk_rows:
        return _score_rows(rows, row_labels, score)
    pieces = []
    for start in range(0, rows.shape[0], chunk_rows):
        chunk, chunk_labels = rows[start : start + chunk_rows], row_labels[start : start + chunk_rows]
        if torch.is_grad_enabled() and chunk.requires_grad:
            pieces.append(checkpoint(_score_rows, chunk, chunk_labels, score, use_reentrant=False))
        else:
            pieces.append(_score_rows(chunk, chunk_labels, score))
    return torch.cat([ce for ce, _ in pieces]), torch.cat([hit for _, hit in pieces])


# DSpark (arXiv 2607.05147, §3.3; DeepSpec's `dspark/loss.py` and its Qwen3 recipe): 0.1 CE + 0.9 L1
# (the L1 distance |p_draft - p_target|_1, twice the total variation: 1 - TV is the chance the target
# accepts the draft) on the Markov-corrected distribution, plus 1.0 x the confidence head's binary
# cross-entropy against that acceptance, every term weighted per position and normalised alike.
DSPARK_CE_WEIGHT = 0.1
DSPARK_TV_WEIGHT = 0.9
DSPARK_CONFIDENCE_WEIGHT = 1.0


def dspark_loss_from_hidden(
    rows_input: torch.Tensor,
    score,
    labels: torch.Tensor,
    label_mask: torch.Tensor,
    weights: torch.Tensor,
    confidence_logits: torch.Tensor | None = None,
    chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
    keep: torch.Tensor | None = None,
    ce_weight: float = DSPARK_CE_WEIGHT,
    tv_weight: float = DSPARK_TV_WEIGHT,
    confidence_weight: float = DSPARK_CONFIDENCE_WEIGHT,
) -> LossOutput:
    """The DSpark loss over B predictions per block: rows_input [..., B, D], labels/label_mask [..., B],
    weights [B], confidence_logits [..., B] (None without a confidence head).

    `score` maps rows [M, D] to Markov-corrected logits [M, V] (the caller packs each row's hidden
    state and its previous token's Markov embedding into D). Rows are scored as in
    `dflash_loss_from_hidden` (only unmasked ones, in checkpointed chunks).

    The target distribution is the label's one-hot: the target's greedy (temperature-0) distribution
    on target-regenerated data, which needs no stored target logits and keeps online training equal
    to offline. Against a one-hot, p_target's L1 distance is 2 (1 - p_draft(label)) and the acceptance
    the confidence head learns is p_draft(label) = exp(-CE).
    `LossOutput.weighted_ce_sum` / `weight_sum` keep the CE part alone, comparable with DFlash's.
    """
    if keep is None:
        keep = torch.nonzero(label_mask.reshape(-1) > 0).squeeze(1)
    keep = keep.to(rows_input.device, non_blocking=True)
    rows = rows_input.reshape(-1, rows_input.shape[-1]).index_select(0, keep)
    ce_selected, hit_selected = chunked_cross_entropy(rows, labels.reshape(-1).index_select(0, keep), score, chunk_rows)
    ce = torch.zeros(labels.numel(), dtype=ce_selected.dtype, device=ce_selected.device).index_put((keep,), ce_selected)
    with torch.no_grad():
        hit = torch.zeros(labels.numel(), dtype=torch.float32, device=labels.device).index_put((keep,), hit_selected)
    output = _weighted_loss(ce.view(labels.shape), hit.view(labels.shape), label_mask, weights)
    full_weights = label_mask * weights.to(label_mask.device)
    weight_sum = full_weights.sum().clamp_min(1e-12)
    accept = torch.exp(-ce.view(labels.shape))
    l1 = 2.0 * (1.0 - accept)
    loss = ce_weight * output.loss + tv_weight * (l1 * full_weights).sum() / weight_sum
    if confidence_logits is not None:
        bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), accept.detach(), reduction="none")
        loss = loss + confidence_weight * (bce * full_weights).sum() / weight_sum
    output.loss = loss
    return output
