"""Block-sparse attention for training the drafter on many blocks of one sequence at once.

Training puts N blocks of B tokens side by side as queries; keys/values are
[context (T target features) | the N*B block positions]. Block i may see:
  - context positions p < a_i (strictly before its anchor): at inference the anchor is the bonus
    token the target has not processed yet, so its own feature is not in the drafter's context;
  - its own B positions, in both directions;
  - nothing of any other block.
A padding block (anchor_valid False) sees only itself, never an empty row (softmax would be NaN).
A draft layer with a sliding window W (`layer_types` "sliding_attention", `sliding_window` W) also
drops every key more than W-1 positions from the query: the query at position a_i+k sees context
p >= a_i+k-W+1, and block keys within W-1 of it (all of them when W >= B). That is the window
vLLM and SGLang serve a non-causal DFlash layer with (flash-attention window (W-1, W-1)), applied
by each path below; `window=None` is full attention.

`BlockLayout` carries these rules (anchors, not a mask) and how to compute them:
  - "dense": the reference. Materialises the boolean mask [S, 1, N*B, T + N*B] and attends over
    every key. At the paper's shape (T 3072, N 512, B 16) a query sees about 1/7 of its keys.
  - "sparse": tiled SDPA. Blocks are processed in tiles of about `tile_queries` queries; a tile's
    keys are the context prefix up to its largest anchor plus the tile's own block keys, so work and
    memory scale with what is visible (context prefix + own tile), not with T + N*B, and no dense
    mask exists (each tile has its own small one).
  - "flex": `flex_attention` with a block mask built from the anchors (no dense mask). torch 2.13 has
    no FlexAttention backward on CPU, so it trains on CUDA only (compiled); on CPU it runs forward only.
All three compute the same function; tests hold them equal in outputs and gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from draftsmith.core.errors import InputError

ATTENTION_MODES = ("auto", "dense", "sparse", "flex")
# About 256 queries a tile: measured on CPU (benchmarks/bench_attention.py --tiles) the sweet spot
# between per-call overhead (small tiles) and the tile's block-diagonal waste (large tiles).
DEFAULT_TILE_QUERIES = 256
# Measured on CPU (bench_attention.py): recomputing tiles cost +10..40% time at the paper's shape,
# where the kept copies are 5x the dense keys (1 GiB a layer at 32 heads x 128 in bf16) and
# recomputing cuts peak memory 3x, and +35..57% at the demo's, where they are 1.7x. Recompute above 3x.
KEPT_KEYS_LIMIT = 3.0


def choose_attention(requested: str, device: torch.device | str, dropout: float = 0.0) -> str:
    """The attention path a training run uses: `requested`, or for "auto" the measured rule.

    Rule: on CPU "sparse" (benchmarks/bench_attention.py, fp32: faster and smaller than "dense" at the
    paper's and the demo's shapes; "flex" has no CPU backward). On CUDA "flex": benchmarks/gpu_check.sh
    on one H200 (torch 2.11, bf16, T 3072, 512 blocks of 16, 32/8 heads x 128, forward+backward of one
    layer) measured flex 9.4 ms, dense 60.0 ms and sparse 176.4 ms, peak 1.47 / 1.47 / 2.23 GiB, flex
    within 2.0e-3 of dense. Flex has no attention dropout, so with dropout auto takes "dense", the next
    fastest there.
    """
    device = torch.device(device)
    if requested not in ATTENTION_MODES:
        raise InputError(f"attention must be one of {', '.join(ATTENTION_MODES)}, got {requested!r}")
    if requested == "flex" and device.type != "cuda":
        raise InputError("attention=flex needs a CUDA device: torch has no FlexAttention backward on CPU")
    if requested == "auto":
        if device.type != "cuda":
            return "sparse"
        return "dense" if dropout > 0 else "flex"
    return requested


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """Where the blocks of a micro-batch sit, and which attention path computes them."""

    anchors: torch.Tensor  # [S, N] long (padding anchors are 0)
    anchor_valid: torch.Tensor  # [S, N] bool
    context_length: int  # T
    block_size: int  # B
    mode: str = "sparse"  # dense | sparse | flex
    tile_queries: int = DEFAULT_TILE_QUERIES
    # sparse: recompute each tile in backward instead of keeping its gathered keys. None = when the
    # kept copies would pass KEPT_KEYS_LIMIT x the dense key count (see `recomputes_tiles`).
    recompute_tiles: bool | None = None
    # Per-micro-batch plans (tiles, flex block mask), computed once and shared by every layer.
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in ("dense", "sparse", "flex"):
            raise ValueError(f"BlockLayout.mode must be dense, sparse or flex, got {self.mode!r}")

    @property
    def num_blocks(self) -> int:
        return self.anchors.shape[1]

    @property
    def num_queries(self) -> int:
        return self.num_blocks * self.block_size

    def with_mode(self, mode: str) -> BlockLayout:
        return replace(self, mode=mode, _cache={})

    def to(self, device: torch.device | str) -> BlockLayout:
        return replace(self, anchors=self.anchors.to(device), anchor_valid=self.anchor_valid.to(device), _cache={})

    def dense_mask(self, window: int | None = None) -> torch.Tensor:
        """Boolean mask [S, 1, N*B, T + N*B], True = may attend (the reference's input)."""
        return _visible(self.anchors, self.anchor_valid, 0, self.num_blocks, self.context_length, self.block_size, window)[:, None]


def _visible(
    anchors: torch.Tensor, anchor_valid: torch.Tensor, first_block: int, end_block: int, prefix: int, block_size: int,
    window: int | None = None,
) -> torch.Tensor:
    """[S, Q', prefix + Q'] visibility of blocks first_block..end_block-1 over [context[:prefix] | those blocks]."""
    anchors = anchors[:, first_block:end_block]
    valid = anchor_valid[:, first_block:end_block]
    count = end_block - first_block
    device = anchors.device
    query_index = torch.arange(count * block_size, device=device)
    query_block, query_offset = query_index // block_size, query_index % block_size
    query_anchor = anchors.repeat_interleave(block_size, dim=1)  # [S, Q']
    context_positions = torch.arange(prefix, device=device)[None, None, :]
    sees_context = context_positions < query_anchor[:, :, None]
    sees_context &= valid.repeat_interleave(block_size, dim=1)[:, :, None]
    same_block = query_block[:, None] == query_block[None, :]
    if window is not None:
        query_position = (query_anchor + query_offset[None, :])[:, :, None]
        sees_context &= query_position - context_positions < window
        same_block &= (query_offset[:, None] - query_offset[None, :]).abs() < window
    sees_block = same_block.expand(anchors.shape[0], -1, -1)
    return torch.cat([sees_context, sees_block], dim=2)


def block_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: BlockLayout,
    scale: float,
    dropout_p: float = 0.0,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of N*B block queries over [context | blocks] keys under `layout`'s rules.

    query [S, H, N*B, D]; key/value [S, H_kv, T + N*B, D] after q/k-norm and RoPE; returns
    [S, H, N*B, D]. Grouped-query heads share their key/value head as in the dense reference.
    `window`: the layer's sliding window (None: full attention), see the module docstring.
    """
    expected = layout.context_length + layout.num_queries
    if query.shape[2] != layout.num_queries or key.shape[2] != expected:
        raise ValueError(
            f"block attention: {query.shape[2]} queries over {key.shape[2]} keys, but the layout has "
            f"{layout.num_blocks} blocks of {layout.block_size} over a context of {layout.context_length}"
        )
    if layout.mode == "flex":
        if dropout_p:
            raise ValueError("attention=flex has no attention dropout; use sparse or dense")
        return _flex_attention(query, key, value, layout, scale, window)
    if layout.mode == "sparse":
        return _tiled_attention(query, key, value, layout, scale, dropout_p, window)
    key, value = _repeat_kv(key, value, query.shape[1])
    mask = layout.dense_mask(window).to(query.device)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def _repeat_kv(key: torch.Tensor, value: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    groups = heads // key.shape[1]
    if groups == 1:
        return key, value
    return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)


def _tile_plan(layout: BlockLayout, window: int | None = None) -> list[tuple[int, int, int, torch.Tensor]]:
    """(first block, end block, context prefix, mask [S, 1, Q', prefix + Q']) per tile."""
    plan = layout._cache.get(("tiles", window))
    if plan is not None:
        return plan
    blocks_per_tile = max(1, layout.tile_queries // layout.block_size)
    starts = list(range(0, layout.num_blocks, blocks_per_tile))
    prefixes = _tile_prefixes(layout, blocks_per_tile)
    plan = []
    for start, prefix in zip(starts, prefixes):
        end = min(start + blocks_per_tile, layout.num_blocks)
        mask = _visible(layout.anchors, layout.anchor_valid, start, end, prefix, layout.block_size, window)[:, None]
        plan.append((start, end, prefix, mask))
    layout._cache[("tiles", window)] = plan
    return plan


def _tile_prefixes(layout: BlockLayout, blocks_per_tile: int) -> list[int]:
    """Each tile's context prefix: its largest visible anchor (it sees keys 0..a-1).

    One reduction over all tiles and one `.tolist()`: the only time the plan waits on the device,
    once per micro-batch (the plan is cached on the layout and shared by every layer).
    """
    num_sequences, num_blocks = layout.anchors.shape
    if num_blocks == 0:
        return []
    tiles = -(-num_blocks // blocks_per_tile)
    visible = torch.where(layout.anchor_valid, layout.anchors, torch.zeros_like(layout.anchors))
    padded = F.pad(visible, (0, tiles * blocks_per_tile - num_blocks))  # anchor 0 never widens a prefix
    return padded.view(num_sequences, tiles, blocks_per_tile).amax(dim=(0, 2)).tolist()


def _attend_tile(query, mask, keys, values, scale, dropout_p, gqa):
    key, value = torch.cat(keys, dim=2), torch.cat(values, dim=2)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa)


def _tiled_attention(query, key, value, layout: BlockLayout, scale: float, dropout_p: float, window: int | None = None) -> torch.Tensor:
    # Everything is cut with one `split` per tensor, never by slicing per tile: the backward of a
    # slice zero-fills a gradient the size of the whole tensor, once per tile, which on CPU cost
    # more than the attention itself. The context is cut at the tiles' prefixes, so a tile's
    # prefix is a concatenation of whole segments.
    gqa = query.shape[1] != key.shape[1]
    if gqa and query.device.type != "cpu":
        # CPU's fused kernel shares kv heads natively; CUDA's masked kernel may not, repeat them.
        key, value = _repeat_kv(key, value, query.shape[1])
        gqa = False
    plan = _tile_plan(layout, window)
    tile_sizes = [(end - start) * layout.block_size for start, end, _, _ in plan]
    bounds = sorted({prefix for _, _, prefix, _ in plan if prefix > 0} | {layout.context_length})
    segment_sizes = [bound - previous for previous, bound in zip([0, *bounds[:-1]], bounds)]
    segments_before = {0: 0, **{bound: index + 1 for index, bound in enumerate(bounds)}}
    queries = query.split(tile_sizes, dim=2)
    key_parts = key.split(segment_sizes + tile_sizes, dim=2)
    value_parts = value.split(segment_sizes + tile_sizes, dim=2)
    context_count = len(segment_sizes)
    # A tile's gathered keys/values are copies (prefix + own blocks); kept for backward they add up
    # to (tiles x mean prefix) keys, several times the dense key tensor (but no dense mask).
    # Recomputing each tile in backward keeps only one tile's copies alive at a time.
    recompute = recomputes_tiles(layout, window) and torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    outputs = []
    for tile, (_, _, prefix, mask) in enumerate(plan):
        used = segments_before[prefix]
        keys = [*key_parts[:used], key_parts[context_count + tile]]
        values = [*value_parts[:used], value_parts[context_count + tile]]
        args = (queries[tile], mask.to(query.device), keys, values, scale, dropout_p, gqa)
        outputs.append(checkpoint(_attend_tile, *args, use_reentrant=False) if recompute else _attend_tile(*args))
    return torch.cat(outputs, dim=2)


def recomputes_tiles(layout: BlockLayout, window: int | None = None) -> bool:
    """Whether the sparse path recomputes tiles in backward (the layout's choice, else the rule)."""
    if layout.recompute_tiles is not None:
        return layout.recompute_tiles
    kept = sum(prefix + (end - start) * layout.block_size for start, end, prefix, _ in _tile_plan(layout, window))
    return kept > KEPT_KEYS_LIMIT * (layout.context_length + layout.num_queries)


_COMPILED_FLEX = None


def _flex_attention(query, key, value, layout: BlockLayout, scale: float, window: int | None = None) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    global _COMPILED_FLEX
    block_mask = layout._cache.get(("flex", window))
    if block_mask is None:
        anchors = layout.anchors.to(query.device)
        valid = layout.anchor_valid.to(query.device)
        context_length, block_size = layout.context_length, layout.block_size

        def mask_mod(batch, head, q_index, kv_index):
            block = q_index // block_size
            in_context = kv_index < context_length
            sees_context = in_context & (kv_index < anchors[batch, block]) & valid[batch, block]
            sees_block = ~in_context & ((kv_index - context_length) // block_size == block)
            return sees_context | sees_block

        def windowed_mask_mod(batch, head, q_index, kv_index):
            block, offset = q_index // block_size, q_index % block_size
            in_context = kv_index < context_length
            # A context key's position is its index; a block key's is its block's anchor plus its offset.
            key_offset = (kv_index - context_length) % block_size
            near_context = anchors[batch, block] + offset - kv_index < window
            near_block = (offset - key_offset).abs() < window
            return mask_mod(batch, head, q_index, kv_index) & torch.where(in_context, near_context, near_block)

        num_sequences = query.shape[0]
        # Compiled, the block mask is built tile by tile; eager would materialise the dense mask.
        block_mask = create_block_mask(
            mask_mod if window is None else windowed_mask_mod, num_sequences, None, query.shape[2], key.shape[2], device=query.device,
            _compile=query.device.type == "cuda",
        )
        layout._cache[("flex", window)] = block_mask
    attend = flex_attention
    if query.device.type == "cuda":
        # Eager flex attention is a reference implementation (dense scores); compiled it is the kernel.
        if _COMPILED_FLEX is None:
            _COMPILED_FLEX = torch.compile(flex_attention, dynamic=True)
        attend = _COMPILED_FLEX
    return attend(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1])
