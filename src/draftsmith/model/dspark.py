"""DSpark (arXiv 2607.05147): the DFlash parallel block plus a sequential Markov head and a confidence head.

The backbone is `DFlashDraftModel` unchanged (same layers, fc, hidden_norm, norm, KV injection). DSpark
differs in three places, all as vLLM 0.32 serves it (`qwen3_dspark.py`, `spec_decode/dspark/`):

- Anchor as first prediction: the query block [anchor, MASK x (N-1)] sits at positions
  anchor..anchor+N-1 and EVERY position predicts the next token (position anchor+k predicts the token
  at anchor+k+1), so a block of N queries drafts N tokens (vLLM's `sample_from_anchor`, its default).
- Markov head: a low-rank transition bias from the previous token, `markov_w2(markov_w1[prev])`
  (V x r, then r x V), added to the base logits; drafts are sampled left to right, `prev` being the
  anchor for the first position and the token just drafted for the next ones. In training `prev` is
  the true previous token (teacher forcing).
- Confidence head: `sigmoid(proj([h_k ; markov_w1[prev]]))`, each position's acceptance estimate
  (vLLM uses it to schedule verification lengths; it does not change the drafts).

Weight names are those `Qwen3DSparkForCausalLM.load_weights` maps: `markov_head.markov_w1.weight`
[vocab_size, r], `markov_head.markov_w2.weight` [draft_vocab_size, r], `confidence_head.proj.{weight,bias}`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.model.config import DSPARK_ARCHITECTURE, DFlashConfig, as_dflash_config
from draftsmith.model.drafter import DFlashDraftModel

# The Markov head is a low-rank bigram table over the vocabulary, so what its rank buys depends on
# the vocabulary and the data, not on the drafter's width. Measured on the tiny target (vocab 1,026,
# bench_recipes.py, 3 seeds): held-out tau 1.918 at r 16, 2.669 at r 256 (DFlash: 2.343). Its cost is
# r/hidden of the LM head per distinct previous token of a scored chunk (`markov_logits_shared`); at
# train's defaults blocks overlap and share most of them (README "DSpark", bench_dspark_step.py).
# tau is what a user keeps: 256 unless asked, as the field trains it.
DEFAULT_MARKOV_RANK = 256


def default_markov_rank(vocab_size: int) -> int:
    """The Markov head's rank when none is asked for: 256, or the whole vocabulary when it is smaller."""
    return max(1, min(DEFAULT_MARKOV_RANK, int(vocab_size)))


class DSparkMarkovHead(nn.Module):
    """Transition bias B(prev) = markov_w2(markov_w1[prev]): [..] token ids -> [.., draft vocab]."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(token_ids)

    def bias(self, markov_embed: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(markov_embed)


class DSparkConfidenceHead(nn.Module):
    """Acceptance logit of each drafted position from [hidden ; Markov embedding of prev] (or hidden alone)."""

    def __init__(self, input_dim: int, with_markov: bool):
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(input_dim, 1, bias=True)

    def forward(self, hidden: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor:
        features = torch.cat([hidden, markov_embed.to(hidden.dtype)], dim=-1) if self.with_markov else hidden
        return self.proj(features.to(self.proj.weight.dtype)).squeeze(-1).float()


class DSparkDraftModel(DFlashDraftModel):
    """The DFlash drafter with DSpark's Markov and confidence heads (see the module docstring)."""

    predicts_from_anchor = True

    def __init__(self, config) -> None:
        config = as_dflash_config(config)
        super().__init__(config)
        rank = int(config.markov_rank)
        vocab = int(config.vocab_size)
        self.markov_head = DSparkMarkovHead(vocab, int(getattr(config, "draft_vocab_size", None) or vocab), rank)
        self.confidence_head = None
        if getattr(config, "enable_confidence_head", False):
            with_markov = bool(getattr(config, "confidence_head_with_markov", False))
            self.confidence_head = DSparkConfidenceHead(config.hidden_size + (rank if with_markov else 0), with_markov)
        std = float(getattr(config, "initializer_range", 0.02))
        with torch.no_grad():
            # A zero W2 makes the untrained bias vanish: training starts from the plain DFlash drafter.
            self.markov_head.markov_w1.weight.normal_(0.0, std)
            self.markov_head.markov_w2.weight.zero_()
            if self.confidence_head is not None:
                self.confidence_head.proj.weight.normal_(0.0, std)
                self.confidence_head.proj.bias.zero_()

    def markov_embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_head.embed(token_ids)

    def markov_logits(self, base_logits: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor:
        """Base logits plus the transition bias of the previous token (its Markov embedding)."""
        return base_logits + self.markov_head.bias(markov_embed.to(self.markov_head.markov_w2.weight.dtype)).to(base_logits.dtype)

    def markov_logits_shared(self, base_logits: torch.Tensor, markov_embeds: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        """`markov_logits` of rows whose Markov embeddings are `markov_embeds[inverse]` (one per distinct
        previous token): when rows share tokens (overlapping blocks do) the bias is computed once per
        token, saving the r x V products of the others; with few shared, the lookup would cost more than
        it saves (a pass over the rows' logits each way) and each row gets its own bias."""
        # Lookups, not indexed adds: their backward sums each token's rows deterministically on CUDA too.
        if 2 * markov_embeds.shape[0] > inverse.shape[0]:
            return self.markov_logits(base_logits, F.embedding(inverse, markov_embeds))
        bias = self.markov_head.bias(markov_embeds.to(self.markov_head.markov_w2.weight.dtype))
        # Summed into the looked-up rows (a fresh tensor that nothing saves for backward): one rows x V
        # tensor fewer to allocate, which on the CPU costs about what the pass itself does.
        return F.embedding(inverse, bias).to(base_logits.dtype).add_(base_logits)

    def confidence(self, hidden: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor | None:
        """Acceptance logits (apply sigmoid for the probability vLLM's `compute_confidence` returns)."""
        if self.confidence_head is None:
            return None
        return self.confidence_head(hidden, markov_embed)


def build_dspark_config(config: DFlashConfig, markov_rank: int | None = None, confidence_head: bool = True) -> DFlashConfig:
    """`config` (from `build_drafter_config`) turned into a DSpark config with the keys vLLM reads
    (`markov_rank` None: `default_markov_rank`)."""
    vocab = int(config.vocab_size)
    if markov_rank is None:
        markov_rank = default_markov_rank(vocab)
    if not 1 <= int(markov_rank) <= vocab:
        raise ValueError(f"markov_rank must be in 1..{vocab} (the vocabulary), got {markov_rank}")
    fields = config.to_dict()
    fields.update(
        architectures=[DSPARK_ARCHITECTURE],
        markov_rank=int(markov_rank),
        markov_head_type="vanilla",
        draft_vocab_size=vocab,
        enable_confidence_head=bool(confidence_head),
        confidence_head_with_markov=bool(confidence_head),
        sample_from_anchor=True,
    )
    return DFlashConfig.from_dict(fields)
