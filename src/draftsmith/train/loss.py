"""The DFlash training loss: position-weighted cross-entropy over each block's predictions.

Block offset k = 1..B-1 predicts the token at anchor+k (no shift: the hidden state at block
position k is read out for the token at that position). Offsets whose label is not a response token
or lies past the end of the sequence are masked. Early offsets matter more, because a draft is
accepted only up to its first mistake. How much each offset counts is a `PositionWeighting`
(`--loss-weights`, chosen by name from `POSITION_WEIGHTINGS`):

- "decay" (the DFlash paper): fixed w_k = exp(-(k-1)/gamma); the loss is sum(w*CE)/sum(w) over every
  unmasked prediction of the micro-batch, and micro-batches and ranks are averaged.
- "dpace" (D-PACE, arXiv 2605.18810): per block, from the drafter's own detached confidence in each
  label q_k = exp(-CE_k), smoothed q~_k = (1-alpha) q_k + alpha (Eq. 7), the weight of offset j is the
  expected accepted length it carries, w_j = sum_{m>=j} prod_{i<=m} q~_i (Eq. 8; masked offsets are a
  no-op in the products and add nothing to the sums). The loss is sum(w*CE) over every block of the
  optimizer step divided by the number of blocks of the step, counted over every micro-batch and
  every rank before any gradient flows (the paper author's anchor normalisation, SpecForge #828/#848,
  made global). A rank-local denominator would make the update depend on how the step's data is
  split over ranks and micro-batches (NeMo Automodel #2572); with the global count, DDP, FSDP2 and
  one process with more micro-batches give the same update.

A drafter variant adds its own terms next to these (its weighting through `position_weighting`,
its reduction through `LossOutput`); the trainer only needs `LossOutput.loss`, the statistics and
`step_share` (see `StepNormaliser`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

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


LOSS_WEIGHTINGS = ("decay", "dpace")
DEFAULT_DPACE_ALPHA = 0.5  # the paper's default and its sensitivity analysis' choice


def dpace_position_weights(ce: torch.Tensor, label_mask: torch.Tensor, alpha: float = DEFAULT_DPACE_ALPHA) -> torch.Tensor:
    """D-PACE weights [..., B-1] (detached, zero where masked) from per-prediction CE [..., B-1].

    q = exp(-CE) is the drafter's probability of the label; q~ = (1-alpha) q + alpha; masked offsets
    count as q~ = 1 in the prefix products and add nothing to the suffix sums;
    w_j = sum_{m >= j, unmasked} prod_{i <= m} q~_i.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"D-PACE alpha must be in (0, 1], got {alpha}")
    with torch.no_grad():
        mask = label_mask.to(torch.float32)
        smoothed = (1.0 - alpha) * torch.exp(-ce.detach().float()) + alpha
        smoothed = torch.where(mask > 0, smoothed, torch.ones_like(smoothed))
        reach = torch.cumprod(smoothed, dim=-1) * mask
        return torch.flip(torch.cumsum(torch.flip(reach, dims=[-1]), dim=-1), dims=[-1]) * mask


@dataclass(frozen=True)
class PositionWeighting:
    """How each block offset's CE counts, and how a step's loss is normalised.

    `global_denominator` False: a micro-batch's loss is sum(w*CE)/sum(w) over its own predictions and
    the step averages micro-batches (and DDP/FSDP the ranks). True: the step's loss is sum(w*CE) over
    all its blocks divided by the step's block count over every micro-batch and rank.
    """

    name: ClassVar[str] = ""
    global_denominator: ClassVar[bool] = False

    def weights(self, ce: torch.Tensor, label_mask: torch.Tensor) -> torch.Tensor:
        """Detached weights [..., B-1], zero where masked."""
        raise NotImplementedError


@dataclass(frozen=True)
class DecayWeighting(PositionWeighting):
    fixed: torch.Tensor  # [B-1]
    name: ClassVar[str] = "decay"

    def weights(self, ce: torch.Tensor, label_mask: torch.Tensor) -> torch.Tensor:
        return label_mask * self.fixed.to(label_mask.device)

    def to(self, device) -> DecayWeighting:
        return DecayWeighting(self.fixed.to(device))


@dataclass(frozen=True)
class DPaceWeighting(PositionWeighting):
    alpha: float = DEFAULT_DPACE_ALPHA
    name: ClassVar[str] = "dpace"
    global_denominator: ClassVar[bool] = True

    def weights(self, ce: torch.Tensor, label_mask: torch.Tensor) -> torch.Tensor:
        return dpace_position_weights(ce, label_mask, self.alpha)

    def to(self, device) -> DPaceWeighting:
        return self


def position_weighting(name: str, block_size: int, gamma: float | None = None, alpha: float = DEFAULT_DPACE_ALPHA) -> PositionWeighting:
    """The weighting `--loss-weights NAME` selects ("decay": gamma; "dpace": alpha)."""
    if name == "decay":
        return DecayWeighting(position_weights(block_size, gamma))
    if name == "dpace":
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"D-PACE alpha must be in (0, 1], got {alpha}")
        return DPaceWeighting(float(alpha))
    raise ValueError(f"loss weighting must be one of {', '.join(LOSS_WEIGHTINGS)}, got {name!r}")


def _as_weighting(weights: torch.Tensor | PositionWeighting) -> PositionWeighting:
    return weights if isinstance(weights, PositionWeighting) else DecayWeighting(weights)


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable: this micro-batch's loss on its own (see module docstring)
    weighted_ce_sum: torch.Tensor  # sum(w * CE), detached
    weight_sum: torch.Tensor  # sum(w), detached
    correct: torch.Tensor  # [B-1] greedy-correct predictions per offset, detached
    counted: torch.Tensor  # [B-1] unmasked predictions per offset
    accepted_prefix: torch.Tensor  # [] sum over blocks of the correct-prefix length (tau - 1)
    blocks: torch.Tensor  # [] number of blocks with at least one label


def _weighted_loss(
    ce: torch.Tensor, hit: torch.Tensor, label_mask: torch.Tensor, weights: torch.Tensor | PositionWeighting,
    denominator: torch.Tensor | None = None, term: torch.Tensor | None = None,
) -> LossOutput:
    """The weighted loss and its statistics from per-prediction CE and greedy hits [..., B-1].

    `denominator`: a weighting with a global denominator divides sum(w*CE) by it (the step's block
    count, see `StepNormaliser`); without one, by this micro-batch's own block count. `term`: the
    per-prediction loss in place of CE (soft targets' KL); the weights (D-PACE's confidence) and the
    logged `weighted_ce_sum` stay the label's CE, so runs with and without it log alike."""
    weighting = _as_weighting(weights)
    full_weights = weighting.weights(ce, label_mask)
    weighted_ce_sum = (ce * full_weights).sum()
    weighted_term_sum = weighted_ce_sum if term is None else (term * full_weights).sum()
    weight_sum = full_weights.sum()
    has_labels = label_mask[..., 0] > 0
    if weighting.global_denominator:
        count = denominator if denominator is not None else has_labels.sum()
        loss = weighted_term_sum / count.to(weighted_term_sum).clamp_min(1.0)
    else:
        loss = weighted_term_sum / weight_sum.clamp_min(1e-12)
    with torch.no_grad():
        hit = hit * label_mask
        reduce_dims = tuple(range(hit.dim() - 1))
        # A block drafts correctly up to its first miss; masked offsets end the prefix as well.
        prefix = torch.cumprod(hit, dim=-1).sum(-1)
        return LossOutput(
            loss=loss,
            weighted_ce_sum=weighted_ce_sum.detach(),
            weight_sum=weight_sum.detach(),
            correct=hit.sum(reduce_dims),
            counted=label_mask.sum(reduce_dims),
            accepted_prefix=(prefix * has_labels).sum(),
            blocks=has_labels.sum(),
        )


@dataclass(frozen=True)
class StepNormaliser:
    """How a micro-batch's loss enters its optimizer step (gradients) and the logged step loss.

    The step's gradient is the sum of the micro-batches' backward terms, averaged over ranks by
    DDP/FSDP. Local weighting: each micro-batch's own normalised loss / micro-batches. Global
    weighting: sum(w*CE) / `step_blocks` (the step's blocks over all micro-batches and ranks) times
    the world size, which the rank average divides back out. `share` is the micro-batch's part of
    the step loss, so that summing it over every micro-batch of every rank gives the step loss.
    """

    weighting: PositionWeighting
    micro_batches: int
    world_size: int = 1
    step_blocks: torch.Tensor | None = None  # global weighting only: blocks of the step, all ranks

    @property
    def denominator(self) -> torch.Tensor | None:
        return self.step_blocks if self.weighting.global_denominator else None

    def backward_term(self, loss: torch.Tensor) -> torch.Tensor:
        if self.weighting.global_denominator:
            return loss * self.world_size
        return loss / self.micro_batches

    def share(self, loss: torch.Tensor) -> torch.Tensor:
        if self.weighting.global_denominator:
            return loss.detach()
        return loss.detach() / (self.micro_batches * self.world_size)


def step_block_count(label_masks) -> torch.Tensor:
    """Blocks with at least one label over the micro-batches' host label masks [S, N, B-1] (a float64 scalar)."""
    return torch.tensor(float(sum(int((mask[..., 0] > 0).sum()) for mask in label_masks)), dtype=torch.float64)


def dflash_loss(
    logits: torch.Tensor, labels: torch.Tensor, label_mask: torch.Tensor, weights: torch.Tensor | PositionWeighting,
    denominator: torch.Tensor | None = None,
) -> LossOutput:
    """logits [..., B-1, V], labels/label_mask [..., B-1], weights [B-1] (decay) or a `PositionWeighting`."""
    vocab = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, vocab).float(), labels.reshape(-1), reduction="none").view(labels.shape)
    with torch.no_grad():
        hit = (logits.argmax(-1) == labels).float()
    return _weighted_loss(ce, hit, label_mask, weights, denominator)


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
    weights: torch.Tensor | PositionWeighting,
    chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
    keep: torch.Tensor | None = None,
    denominator: torch.Tensor | None = None,
    soft_targets: str = "off",
    target: TargetRows | None = None,
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

    `soft_targets` "kl" or "tv" with `target` (the target's rows, `TargetRows`): the loss is
    against the target's full next-token distribution (`SOFT_TARGETS`), chunked alike.
    """
    if soft_targets == "off":
        ce, hit = _kept_cross_entropy(hidden, score, labels, label_mask, chunk_rows, keep)
        return _weighted_loss(ce, hit, label_mask, weights, denominator)
    divergence_weight, l1_weight = _soft_mix(soft_targets, target)
    ce, hit, kl, l1 = _kept_soft_scores(hidden, score, labels, label_mask, chunk_rows, keep, target)
    return _mixed_loss(ce, hit, label_mask, weights, denominator, kl, l1, divergence_weight, l1_weight)


# Soft targets (`--soft-targets`): the per-prediction terms against the target's distribution p, for
# the drafter's q: KL(p || q) = sum p (log p - log q) (CE less the target's entropy: the same gradient
# as CE against p), and the L1 distance |p - q|_1 = 2 TV(p, q), whose complement 1 - TV = sum min(p, q)
# is the chance that speculative sampling accepts the draft (DSpark §3.3). "kl": KL alone (speculators'
# DSpark default, KL + the confidence head); "tv": DSpark's mix, 0.1 KL + 0.9 L1, for either drafter.
SOFT_TARGETS = ("off", "kl", "tv")


def _soft_mix(soft_targets: str, target) -> tuple[float, float]:
    """(divergence weight, L1 weight) of a soft-target loss."""
    mixes = {"kl": (1.0, 0.0), "tv": (DSPARK_CE_WEIGHT, DSPARK_TV_WEIGHT)}
    if soft_targets not in mixes:
        raise ValueError(f"soft_targets must be one of {', '.join(SOFT_TARGETS)}, got {soft_targets!r}")
    if target is None:
        raise ValueError(f"soft_targets {soft_targets!r} needs the target's rows (`target`)")
    return mixes[soft_targets]


@dataclass(frozen=True)
class TargetRows:
    """The target's side of a soft-target loss: `score(hidden[index])` is the target's next-token
    logits for each prediction. hidden [R, H] (the target's final-norm states, no grad); index [...]
    shaped like the labels (best on the host: the kept ones are selected there); score [M, H] -> [M, V]."""

    hidden: torch.Tensor
    index: torch.Tensor
    score: Callable


def _kept_cross_entropy(
    rows_input: torch.Tensor, score, labels: torch.Tensor, label_mask: torch.Tensor, chunk_rows: int | None,
    keep: torch.Tensor | None, row_keys: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CE (differentiable) and greedy hits, both shaped like `labels`, of the unmasked predictions of
    rows_input [..., D] scored by `chunked_cross_entropy` (zeros elsewhere). `keep` and `row_keys`
    ([...] like `labels`) as in `dflash_loss_from_hidden` and `dspark_loss_from_hidden`."""
    rows, kept_labels, kept_keys, keep = _kept_rows(rows_input, labels, label_mask, keep, row_keys)
    ce_selected, hit_selected = chunked_cross_entropy(rows, kept_labels, score, chunk_rows, row_keys=kept_keys)
    return _scattered(ce_selected, keep, labels), _scattered(hit_selected, keep, labels, hits=True)


def _kept_soft_scores(
    rows_input: torch.Tensor, score, labels: torch.Tensor, label_mask: torch.Tensor, chunk_rows: int | None,
    keep: torch.Tensor | None, target: TargetRows, row_keys: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """As `_kept_cross_entropy`, against the target's distribution too: (CE, hits, KL, L1), each shaped like `labels`."""
    host_keep = torch.nonzero(label_mask.reshape(-1) > 0).squeeze(1) if keep is None else keep
    rows, kept_labels, kept_keys, keep = _kept_rows(rows_input, labels, label_mask, host_keep, row_keys)
    source = target.index.reshape(-1).index_select(0, host_keep.to(target.index.device))
    target_rows = target.hidden.index_select(0, source.to(target.hidden.device, non_blocking=True))
    ce, kl, l1, hit = _chunked(partial(_score_rows_soft, score=score, target_score=target.score), rows, kept_labels,
                               chunk_rows, kept_keys, target_rows)  # fmt: skip
    return (_scattered(ce, keep, labels), _scattered(hit, keep, labels, hits=True), _scattered(kl, keep, labels),
            _scattered(l1, keep, labels))  # fmt: skip


def _kept_rows(rows_input, labels, label_mask, keep, row_keys):
    """(the kept rows [M, D], their labels [M], their keys or None, `keep` on the rows' device)."""
    if keep is None:
        keep = torch.nonzero(label_mask.reshape(-1) > 0).squeeze(1)
    # Selected where the keys lie (the host batch and its host `keep`, in training: no device wait).
    kept_keys = None if row_keys is None else row_keys.reshape(-1).index_select(0, keep.to(row_keys.device))
    keep = keep.to(rows_input.device, non_blocking=True)
    rows = rows_input.reshape(-1, rows_input.shape[-1]).index_select(0, keep)
    return rows, labels.reshape(-1).index_select(0, keep), kept_keys, keep


def _scattered(selected: torch.Tensor, keep: torch.Tensor, labels: torch.Tensor, hits: bool = False) -> torch.Tensor:
    """Per-kept-prediction values put back in place, zeros elsewhere, shaped like `labels`."""
    if hits:
        with torch.no_grad():
            return torch.zeros(labels.numel(), dtype=torch.float32, device=labels.device).index_put((keep,), selected).view(labels.shape)
    return torch.zeros(labels.numel(), dtype=selected.dtype, device=selected.device).index_put((keep,), selected).view(labels.shape)


def _score_rows(rows: torch.Tensor, row_labels: torch.Tensor, *groups: torch.Tensor, score) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cross-entropy and greedy hits of one chunk of rows; its logits die with the call."""
    logits = score(rows, *groups)
    ce = F.cross_entropy(logits.float(), row_labels, reduction="none")
    hit = (logits.detach().argmax(-1) == row_labels).float()
    return ce, hit


def _score_rows_soft(rows: torch.Tensor, row_labels: torch.Tensor, target_rows: torch.Tensor, *groups: torch.Tensor, score,
                     target_score) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """fp32 (CE, KL(p || q), |p - q|_1, greedy hits) of one chunk of rows against the target's
    distribution p of the same rows; both chunks' logits die with the call."""
    logits = score(rows, *groups)
    log_q = F.log_softmax(_at_least_fp32(logits), dim=-1)
    ce = -log_q.gather(-1, row_labels[:, None]).squeeze(-1)
    with torch.no_grad():
        log_p = F.log_softmax(_at_least_fp32(target_score(target_rows)), dim=-1)
        p = log_p.exp()
    # A token the target rules out (p = 0, log p = -inf: a masked logit) adds nothing, not 0 * inf.
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(log_q)).sum(-1)
    l1 = (p - log_q.exp()).abs().sum(-1)
    hit = (logits.detach().argmax(-1) == row_labels).float()
    return ce, kl, l1, hit


def _at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """Softmax in fp32 at least (bf16/fp16 logits under autocast), float64 kept (the tests' reference)."""
    return logits if logits.dtype == torch.float64 else logits.float()


def _key_groups(keys: torch.Tensor | None, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(the distinct keys, each row's index among them) on `device`, or () without keys; computed
    where `keys` lie (the host, in training: no device wait)."""
    if keys is None:
        return ()
    distinct, inverse = torch.unique(keys, return_inverse=True)
    return distinct.to(device, non_blocking=True), inverse.to(device, non_blocking=True)


def chunked_cross_entropy(
    rows: torch.Tensor, row_labels: torch.Tensor, score, chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
    row_keys: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row CE [M] (differentiable) and greedy hits [M] of `score(rows)` against `row_labels`.

    Each chunk runs under `torch.utils.checkpoint`: forward keeps only the chunk's inputs, and
    backward recomputes the chunk's logits (same autocast state) to form their gradient, one chunk at
    a time. The values and gradients equal the one-pass computation.

    `row_keys` [M] (integers, best on the host): each chunk is scored as `score(rows, distinct, inverse)`,
    its rows' distinct keys and each row's index among them, so that a term that depends on the key
    alone is computed once per distinct key of the chunk (DSpark's Markov bias: once per previous token).
    """
    return _chunked(partial(_score_rows, score=score), rows, row_labels, chunk_rows, row_keys)


def _chunked(score_chunk, rows: torch.Tensor, row_labels: torch.Tensor, chunk_rows: int | None,
             row_keys: torch.Tensor | None, *aligned: torch.Tensor) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """`score_chunk(rows, labels, *aligned, *key groups)` (a tuple of per-row tensors) over chunks of
    `chunk_rows` rows, each checkpointed (see `chunked_cross_entropy`), concatenated back."""
    from torch.utils.checkpoint import checkpoint

    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError("chunk_rows must be at least 1")
    if chunk_rows is None or rows.shape[0] <= chunk_rows:
        return score_chunk(rows, row_labels, *aligned, *_key_groups(row_keys, rows.device))
    pieces = []
    for start in range(0, rows.shape[0], chunk_rows):
        part = slice(start, start + chunk_rows)
        groups = _key_groups(None if row_keys is None else row_keys[part], rows.device)
        arguments = (rows[part], row_labels[part], *(tensor[part] for tensor in aligned), *groups)
        if torch.is_grad_enabled() and rows.requires_grad:
            pieces.append(checkpoint(score_chunk, *arguments, use_reentrant=False))
        else:
            pieces.append(score_chunk(*arguments))
    return tuple(torch.cat(parts) for parts in zip(*pieces, strict=True))


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
    weights: torch.Tensor | PositionWeighting,
    confidence_logits: torch.Tensor | None = None,
    chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
    keep: torch.Tensor | None = None,
    denominator: torch.Tensor | None = None,
    ce_weight: float = DSPARK_CE_WEIGHT,
    tv_weight: float = DSPARK_TV_WEIGHT,
    confidence_weight: float = DSPARK_CONFIDENCE_WEIGHT,
    previous: torch.Tensor | None = None,
    soft_targets: str = "off",
    target: TargetRows | None = None,
) -> LossOutput:
    """The DSpark loss over B predictions per block: rows_input [..., B, D], labels/label_mask [..., B],
    weights [B] or a `PositionWeighting` (with `denominator` as in `dflash_loss_from_hidden`), confidence_logits [..., B] (None without a confidence head).

    `score` maps rows [M, D] to Markov-corrected logits [M, V]. With `previous` [..., B] (each
    prediction's previous token, or any one-to-one relabelling of it; best on the host) it is called as `score(rows, tokens, inverse)`: the
    distinct previous tokens of the chunk and each row's index among them, so the bias is computed once
    per distinct token (overlapping blocks share most of theirs); without it the caller packs each
    row's Markov embedding into D. Rows are scored as in `dflash_loss_from_hidden` (only unmasked ones,
    in checkpointed chunks).

    The target distribution is the label's one-hot: the target's greedy (temperature-0) distribution
    on target-regenerated data, which needs no stored target logits and keeps online training equal
    to offline. Against a one-hot, p_target's L1 distance is 2 (1 - p_draft(label)) and the acceptance
    the confidence head learns is p_draft(label) = exp(-CE). With `soft_targets` "kl" or "tv" and
    `target`, it is the target's full distribution (`SOFT_TARGETS`): KL in place of CE, the L1
    distance and the acceptance sum min(p, q) computed against it (ce_weight/tv_weight then follow the choice).
    `LossOutput.weighted_ce_sum` / `weight_sum` keep the label's CE part alone, comparable with DFlash's.
    """
    if soft_targets == "off":
        ce, hit = _kept_cross_entropy(rows_input, score, labels, label_mask, chunk_rows, keep, row_keys=previous)
        accept = torch.exp(-ce)
        return _mixed_loss(ce, hit, label_mask, weights, denominator, None, 2.0 * (1.0 - accept), ce_weight, tv_weight,
                           accept, confidence_logits, confidence_weight)  # fmt: skip
    ce_weight, tv_weight = _soft_mix(soft_targets, target)
    ce, hit, kl, l1 = _kept_soft_scores(rows_input, score, labels, label_mask, chunk_rows, keep, target, row_keys=previous)
    return _mixed_loss(ce, hit, label_mask, weights, denominator, kl, l1, ce_weight, tv_weight, 1.0 - 0.5 * l1,
                       confidence_logits, confidence_weight)  # fmt: skip


def _mixed_loss(
    ce: torch.Tensor, hit: torch.Tensor, label_mask: torch.Tensor, weights: torch.Tensor | PositionWeighting,
    denominator: torch.Tensor | None, divergence: torch.Tensor | None, l1: torch.Tensor, divergence_weight: float,
    l1_weight: float, accept: torch.Tensor | None = None, confidence_logits: torch.Tensor | None = None,
    confidence_weight: float = DSPARK_CONFIDENCE_WEIGHT,
) -> LossOutput:
    """divergence_weight x the weighted divergence (CE when None) + l1_weight x the weighted L1
    distance (+ the confidence head's BCE against `accept`), every term normalised as the first is:
    by sum(w), or by the step's blocks (global weighting)."""
    weighting = _as_weighting(weights)
    output = _weighted_loss(ce, hit, label_mask, weighting, denominator, term=divergence)
    if l1_weight == 0.0 and confidence_logits is None:
        output.loss = divergence_weight * output.loss
        return output
    full_weights = weighting.weights(ce, label_mask)
    if weighting.global_denominator:
        count = denominator if denominator is not None else (label_mask[..., 0] > 0).sum()
        norm = count.to(full_weights).clamp_min(1.0)
    else:
        norm = full_weights.sum().clamp_min(1e-12)
    loss = divergence_weight * output.loss + l1_weight * (l1 * full_weights).sum() / norm
    if confidence_logits is not None:
        bce = F.binary_cross_entropy_with_logits(_at_least_fp32(confidence_logits), accept.detach(), reduction="none")
        loss = loss + confidence_weight * (bce * full_weights).sum() / norm
    output.loss = loss
    return output
