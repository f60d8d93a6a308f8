"""The DFlash drafter: a few Qwen3-style decoder layers whose keys/values see the target's features.

Per layer, queries come from the block only; keys and values are computed from the concatenation
[fused target context | block], so every block token attends to the whole (visible) context and
to its whole block: attention is bidirectional, there is no causal mask. The fused context is
`hidden_norm(fc(cat of k target-layer features))`, computed once and shared by all layers; it goes
straight into each layer's k_proj/v_proj (no per-layer input norm), as in the reference.

Parameter names match the reference `dflash.DFlashDraftModel`, SGLang and vLLM:
`layers.{i}.self_attn.{q,k,v,o}_proj`, `layers.{i}.self_attn.{q,k}_norm`,
`layers.{i}.mlp.{gate,up,down}_proj`, `layers.{i}.{input,post_attention}_layernorm`, `fc`,
`hidden_norm`, `norm`. The drafter owns no embedding and no lm_head: callers embed block tokens with
the target's (frozen) embedding table and score hidden states with the target's lm_head.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

from draftsmith.model.block_attention import BlockLayout, block_attention
from draftsmith.model.config import DFlashConfig, as_dflash_config, layer_windows


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, L, D]; cos/sin: [B, L, D]
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


def _window_mask(
    attention_mask: torch.Tensor | None, position_ids: torch.Tensor, block_len: int, cached: int, window: int
) -> torch.Tensor:
    """`attention_mask` narrowed to keys within `window` - 1 positions of each query, both ways (as
    engines serve a non-causal sliding layer). Queries are the last `block_len` positions; keys are
    [cache | this call's positions], and the cache holds the context at positions 0..cached-1, as
    speculative decoding fills it. Returns a boolean [B, 1, Q, K] or additive float mask."""
    cache_positions = torch.arange(cached, device=position_ids.device).expand(position_ids.shape[0], -1)
    key_positions = torch.cat([cache_positions, position_ids], dim=1)
    query_positions = position_ids[:, -block_len:]
    near = ((query_positions[:, :, None] - key_positions[:, None, :]).abs() < window)[:, None]
    if attention_mask is None:
        return near
    if attention_mask.dim() == 3:
        attention_mask = attention_mask.unsqueeze(1)
    if attention_mask.dtype == torch.bool:
        return attention_mask & near
    return attention_mask.masked_fill(~near, float("-inf"))


def _as_sdpa_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Boolean masks mean True = may attend; float masks are added to the scores (0 or -inf)."""
    if mask is None:
        return None
    if mask.dim() == 3:
        mask = mask.unsqueeze(1)
    if mask.dtype == torch.bool:
        return mask
    return mask.to(dtype)


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = float(config.attention_dropout or 0.0)
        bias = bool(config.attention_bias)
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.sliding_window = layer_windows(config)[layer_idx]  # None: full attention

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | BlockLayout | None = None,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        kv_input = torch.cat([context, hidden_states], dim=1)
        kv_len = kv_input.shape[1]

        value = self.v_proj(kv_input).view(batch, kv_len, self.num_kv_heads, self.head_dim)
        # The projections' dtype is the compute dtype (autocast's, else the weights'). RMSNorm's
        # fp32 weight would promote bf16 q/k back to fp32 under autocast: attention would then run
        # on fp32 q/k (twice the memory and bandwidth, and flex would refuse the mixed dtypes).
        compute = value.dtype
        query = self.q_norm(self.q_proj(hidden_states).view(batch, q_len, self.num_heads, self.head_dim)).to(compute)
        key = self.k_norm(self.k_proj(kv_input).view(batch, kv_len, self.num_kv_heads, self.head_dim)).to(compute)
        query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)

        cos, sin = (part.to(compute) for part in position_embeddings)
        query = _apply_rope(query, cos[:, -q_len:], sin[:, -q_len:])
        key = _apply_rope(key, cos, sin)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)

        dropout = self.dropout if self.training else 0.0
        if isinstance(attention_mask, BlockLayout):
            if past_key_values is not None:
                raise ValueError("a BlockLayout describes one training call's keys; it takes no cache")
            output = block_attention(query, key, value, attention_mask, self.scaling, dropout, self.sliding_window)
        else:
            groups = self.num_heads // self.num_kv_heads
            if groups > 1:
                key = key.repeat_interleave(groups, dim=1)
                value = value.repeat_interleave(groups, dim=1)
            output = F.scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=_as_sdpa_mask(attention_mask, query.dtype),
                dropout_p=dropout,
                is_causal=False,
                scale=self.scaling,
            )
        output = output.transpose(1, 2).reshape(batch, q_len, self.num_heads * self.head_dim)
        return self.o_proj(output)


class DFlashDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | BlockLayout | None = None,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        attended = self.self_attn(
            self.input_layernorm(hidden_states),
            context,
            position_embeddings,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
        )
        hidden_states = hidden_states + attended
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


def replace_mask_rows(
    noise_embedding: torch.Tensor, block_ids: torch.Tensor | None, mask_token_id: int, mask_embedding: torch.Tensor | None
) -> torch.Tensor:
    """`noise_embedding` with `mask_embedding` at every position where `block_ids` holds the mask id
    (vLLM's `embed_input_ids` for a drafter shipping `mask_embedding.pt`); unchanged without one."""
    if mask_embedding is None or block_ids is None:
        return noise_embedding
    is_mask = (block_ids.to(noise_embedding.device) == int(mask_token_id)).unsqueeze(-1)
    return torch.where(is_mask, mask_embedding.to(noise_embedding.dtype), noise_embedding)


class DFlashDraftModel(Qwen3PreTrainedModel):
    """DFlash block drafter; `forward` mirrors the reference `dflash.DFlashDraftModel.forward`."""

    config_class = DFlashConfig
    _no_split_modules = ["DFlashDecoderLayer"]
    _can_record_outputs = {}
    # DFlash: block position k > 0 predicts the token AT anchor+k; DSpark (model/dspark.py) predicts from the anchor on.
    predicts_from_anchor = False

    def __init__(self, config) -> None:
        config = as_dflash_config(config)
        super().__init__(config)
        self.target_layer_ids = config.target_layer_ids
        self.block_size = int(config.block_size)
        self.mask_token_id = config.mask_token_id
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # A target with no spare embedding row: the mask id's row is replaced by this trained vector
        # wherever the block holds the mask, as vLLM does with a `mask_embedding.pt`.
        self.mask_embedding = None
        if config.has_mask_embedding:
            std = float(getattr(config, "initializer_range", 0.02))
            self.mask_embedding = nn.Parameter(torch.randn(config.hidden_size) * std)
        self.post_init()

    def _apply(self, fn, recurse=True):
        # `.to(bfloat16)` would also round RoPE's inverse frequencies, shifting every angle and
        # diverging from engines and the reference (which keep them in float32). Rebuild them.
        result = super()._apply(fn, recurse)
        rotary = self.rotary_emb
        if rotary.inv_freq.dtype != torch.float32:
            fresh = Qwen3RotaryEmbedding(self.config)
            rotary.inv_freq = fresh.inv_freq.to(rotary.inv_freq.device)
            rotary.original_inv_freq = fresh.original_inv_freq.to(rotary.inv_freq.device)
        return result

    def enable_input_require_grads(self) -> None:
        # There is no embedding layer to hook: block embeddings come from the frozen target, and the
        # fused context (the output of the trainable fc) already carries gradients into every
        # checkpointed layer, so gradient checkpointing needs nothing extra here.
        return None

    def fuse_target_hidden(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[B, C, k*H] raw concatenated target features -> [B, C, H] context for every layer."""
        expected = self.fc.in_features
        if target_hidden.shape[-1] != expected:
            raise ValueError(
                f"target_hidden has last dim {target_hidden.shape[-1]}, expected {expected} "
                f"(= {len(self.target_layer_ids)} target layers x hidden {self.config.hidden_size})"
            )
        return self.hidden_norm(self.fc(target_hidden))

    def forward(
        self,
        position_ids: torch.LongTensor,
        attention_mask: torch.Tensor | BlockLayout | None = None,
        noise_embedding: torch.Tensor | None = None,
        target_hidden: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool = False,
        block_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Hidden states [B, Q, H] for the Q block tokens.

        - `noise_embedding` [B, Q, H]: target embeddings of the block tokens ([anchor, MASK, ...]).
        - `target_hidden` [B, C, k*H]: raw concatenated target features of the new context tokens.
        - `position_ids` [B, C+Q]: positions of [context | block] (used for RoPE).
        - `attention_mask`: None (every query sees every key: inference), or [B, 1, Q, K] boolean
          (True = visible) or additive float, where K = (cached length) + C + Q; or, in training, a
          `BlockLayout` (Q = N blocks of B over this call's context, no cache): block-sparse attention.
        - `past_key_values`: a transformers Cache holding earlier context keys/values; this call
          appends its context AND block keys, so crop it back to the context length afterwards.
        - `block_ids` [B, Q]: the block's token ids; a drafter with its own mask embedding puts it
          at every position holding the mask id (inside forward, so DDP/FSDP see the parameter used).
        """
        if noise_embedding is None or target_hidden is None:
            raise ValueError("DFlashDraftModel.forward needs noise_embedding and target_hidden")
        context_len, block_len = target_hidden.shape[1], noise_embedding.shape[1]
        if position_ids.shape[-1] != context_len + block_len:
            raise ValueError(
                f"position_ids covers {position_ids.shape[-1]} positions; expected context {context_len} "
                f"+ block {block_len}"
            )
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0)
        context = self.fuse_target_hidden(target_hidden)
        hidden_states = replace_mask_rows(noise_embedding, block_ids, self.mask_token_id, self.mask_embedding)
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        masks = self._layer_masks(attention_mask, position_ids, block_len, past_key_values)
        for layer, mask in zip(self.layers, masks):
            hidden_states = layer(
                hidden_states,
                context,
                position_embeddings,
                attention_mask=mask,
                past_key_values=past_key_values if use_cache or past_key_values is not None else None,
            )
        return self.norm(hidden_states)

    def _layer_masks(self, attention_mask, position_ids, block_len: int, past_key_values) -> list:
        """Each layer's mask: a `BlockLayout` as given (each layer applies its own window to it);
        otherwise `attention_mask` narrowed by the layer's sliding window, one mask per window."""
        windows = [layer.self_attn.sliding_window for layer in self.layers]
        if isinstance(attention_mask, BlockLayout) or not any(windows):
            return [attention_mask] * len(windows)
        cached = past_key_values.get_seq_length() if past_key_values is not None else 0
        narrowed = {window: _window_mask(attention_mask, position_ids, block_len, cached, window)
                    for window in set(windows) if window is not None}
        return [attention_mask if window is None else narrowed[window] for window in windows]

    def compute_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Score drafter hidden states with the target's lm_head."""
        logits = lm_head(hidden)
        extras = getattr(self.config, "dflash_config", None) or {}
        multiplier = extras.get("output_multiplier")
        if multiplier is not None:
            logits = logits * float(multiplier)
        softcap = extras.get("final_logit_softcapping")
        if softcap:
            logits = torch.tanh(logits / float(softcap)) * float(softcap)
        return logits
