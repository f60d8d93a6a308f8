"""What the drafter borrows from the target: layer features, the embedding table, the lm_head."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from draftsmith.model.config import MASK_TOKEN


def _decoder(target_model: nn.Module) -> nn.Module:
    # The bare decoder (e.g. Qwen3Model) avoids computing full-vocab logits we never use.
    base = getattr(target_model, "base_model", None)
    return base if isinstance(base, nn.Module) else target_model


def select_layer_features(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """Concatenate decoder-layer outputs: `hidden_states[id + 1]` (index 0 is the embeddings)."""
    if not layer_ids:
        raise ValueError("layer_ids is empty")
    num_layers = len(hidden_states) - 1
    bad = [i for i in layer_ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"target layer ids {bad} out of range: the target has {num_layers} layers")
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@torch.no_grad()
def extract_target_features(
    target_model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layer_ids: Sequence[int],
) -> torch.Tensor:
    """[B, T, k*H] raw concatenation of the target's layer outputs for `layer_ids` (no grad)."""
    output = _decoder(target_model)(
        input_ids=input_ids,
        attention_mask=attention_mask,
        output_hidden_states=True,
        use_cache=False,
    )
    return select_layer_features(output.hidden_states, list(layer_ids))


def target_embed_tokens(target_model: nn.Module) -> nn.Embedding:
    """The target's input embedding table (the drafter embeds block tokens with it, frozen)."""
    embedding = target_model.get_input_embeddings()
    if embedding is None:
        raise ValueError(f"{type(target_model).__name__} exposes no input embeddings")
    return embedding


def target_lm_head(target_model: nn.Module) -> nn.Module:
    """The target's output projection (the drafter scores its hidden states with it, frozen)."""
    head = getattr(target_model, "lm_head", None)
    if head is None:
        head = target_model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(target_model).__name__} has no lm_head; load it as a *ForCausalLM model")
    return head


def freeze(module: nn.Module) -> nn.Module:
    """Turn off gradients for every parameter (the target, its embeddings, its lm_head)."""
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return module


def mask_token_id(tokenizer) -> int | None:
    """The id of `<|MASK|>` in `tokenizer`, or None when it has none."""
    token_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    unk = getattr(tokenizer, "unk_token_id", None)
    if token_id is None or (unk is not None and token_id == unk and MASK_TOKEN != tokenizer.unk_token):
        return None
    return int(token_id)


def ensure_mask_token(tokenizer, target_model: nn.Module | None = None) -> int:
    """Return the id of `<|MASK|>`, adding it to `tokenizer` as a special token if absent.

    Resize implications: a new token gets id `len(tokenizer) - 1`. Most released targets pad their
    embedding table beyond the tokenizer (Qwen3: 151,669 tokens, 151,936 rows, so `<|MASK|>` lands
    on row 151669, the id the published DFlash drafters use) and nothing needs resizing. If the id
    does not fit, pass `target_model` and its embeddings (and an untied lm_head) are resized; the
    new row is untrained, which is fine for a drafter input (the drafter learns what MASK means
    from its own side), but then the TARGET checkpoint changed and the resized target plus the
    updated tokenizer must be saved and served together with the drafter. Without `target_model`
    an id that does not fit raises.
    """
    existing = mask_token_id(tokenizer)
    if existing is None:
        tokenizer.add_tokens([MASK_TOKEN], special_tokens=True)
        existing = mask_token_id(tokenizer)
        if existing is None:
            raise ValueError(f"could not add {MASK_TOKEN} to the tokenizer")
    if target_model is not None:
        rows = target_embed_tokens(target_model).num_embeddings
        if existing >= rows:
            target_model.resize_token_embeddings(existing + 1)
    return existing

