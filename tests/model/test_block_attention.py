"""Block-sparse attention equals the dense reference, in outputs and gradients."""

from __future__ import annotations

import warnings

import pytest
import torch

from draftsmith.core.errors import InputError
from draftsmith.model import DFlashDraftModel, build_drafter_config
from draftsmith.model.block_attention import BlockLayout, block_attention, choose_attention


def _layout(lengths: list[int], num_anchors: list[int], block_size: int, seed: int, shuffle: bool = False):
    """Sorted distinct anchors inside each sequence, padded to the most anchors (padding anchors 0)."""
    generator = torch.Generator().manual_seed(seed)
    most = max(1, max(num_anchors))
    anchors = torch.zeros(len(lengths), most, dtype=torch.long)
    valid = torch.zeros(len(lengths), most, dtype=torch.bool)
    for row, (length, count) in enumerate(zip(lengths, num_anchors, strict=True)):
        count = min(count, length)
        picked = torch.randperm(length, generator=generator)[:count]
        picked = picked if shuffle else picked.sort().values
        anchors[row, :count] = picked
        valid[row, :count] = True
    return anchors, valid, max(lengths)


def _attention_inputs(layout: BlockLayout, heads: int, kv_heads: int, head_dim: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    batch = layout.anchors.shape[0]
    keys = layout.context_length + layout.num_queries
    query = torch.randn(batch, heads, layout.num_queries, head_dim, generator=generator)
    key = torch.randn(batch, kv_heads, keys, head_dim, generator=generator)
    value = torch.randn(batch, kv_heads, keys, head_dim, generator=generator)
    return [tensor.requires_grad_() for tensor in (query, key, value)]


def _run(layout: BlockLayout, inputs, scale: float):
    output = block_attention(*inputs, layout, scale)
    # A fixed random projection of the output, so every output element gets its own gradient.
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(99))
    grads = torch.autograd.grad((output * weights).sum(), inputs)
    return output.detach(), grads


CASES = {
    # name: (lengths, anchors per sequence, block size, heads, kv heads, head dim, tile queries)
    "one sequence, many tiles": ([37], [9], 4, 2, 2, 8, 8),
    "GQA, batch of different lengths and anchor counts (padding blocks)": ([50, 13, 29], [11, 3, 0], 5, 4, 2, 8, 16),
    "sequence shorter than the block": ([3, 21], [2, 6], 8, 4, 1, 16, 16),
    "one block": ([6], [1], 4, 2, 1, 8, 256),
    "tile not a multiple of the block, anchors up to the last token": ([64, 64], [64, 40], 3, 6, 3, 4, 10),
    "paper's block size, one tile holds all": ([120, 90], [20, 15], 16, 4, 2, 8, 1024),
}


@pytest.mark.parametrize("recompute", [False, True], ids=["tiles kept", "tiles recomputed"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_sparse_equals_dense_in_outputs_and_gradients(case, recompute):
    lengths, counts, block_size, heads, kv_heads, head_dim, tile = CASES[case]
    anchors, valid, context_length = _layout(lengths, counts, block_size, seed=len(case))
    dense = BlockLayout(anchors, valid, context_length, block_size, mode="dense")
    sparse = BlockLayout(
        anchors, valid, context_length, block_size, mode="sparse", tile_queries=tile, recompute_tiles=recompute
    )
    inputs = _attention_inputs(dense, heads, kv_heads, head_dim, seed=1)
    scale = head_dim**-0.5
    dense_out, dense_grads = _run(dense, inputs, scale)
    sparse_out, sparse_grads = _run(sparse, inputs, scale)
    assert torch.isfinite(dense_out).all()
    torch.testing.assert_close(sparse_out, dense_out, rtol=1e-5, atol=1e-5)
    for name, a, b in zip(("query", "key", "value"), sparse_grads, dense_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_unsorted_anchors_are_still_exact():
    anchors, valid, context_length = _layout([40, 33], [7, 5], 4, seed=3, shuffle=True)
    dense = BlockLayout(anchors, valid, context_length, 4, mode="dense")
    inputs = _attention_inputs(dense, 2, 2, 8, seed=2)
    dense_out, dense_grads = _run(dense, inputs, 0.3)
    sparse_out, sparse_grads = _run(BlockLayout(anchors, valid, context_length, 4, tile_queries=8), inputs, 0.3)
    torch.testing.assert_close(sparse_out, dense_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(sparse_grads, dense_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_sparse_tiles_see_only_a_prefix_and_their_own_blocks():
    # 4 blocks of 2 with anchors 3, 5, 20, 30 in tiles of 2 blocks: the first tile's keys stop at
    # context position 5, not at 32 + 8 -- the work scales with what is visible.
    anchors = torch.tensor([[3, 5, 20, 30]])
    layout = BlockLayout(anchors, torch.ones_like(anchors, dtype=torch.bool), 32, 2, tile_queries=4)
    from draftsmith.model.block_attention import _tile_plan

    plan = _tile_plan(layout)
    assert [(start, end, prefix) for start, end, prefix, _ in plan] == [(0, 2, 5), (2, 4, 30)]
    assert [tuple(mask.shape) for *_, mask in plan] == [(1, 1, 4, 5 + 4), (1, 1, 4, 30 + 4)]


def test_tiles_are_recomputed_only_where_their_kept_keys_would_be_large():
    from draftsmith.model.block_attention import recomputes_tiles

    anchors = torch.arange(300, 3000, 6)[None]  # 450 blocks of 16 over 3072: many long prefixes
    long = BlockLayout(anchors, torch.ones_like(anchors, dtype=torch.bool), 3072, 16)
    assert recomputes_tiles(long)
    assert not recomputes_tiles(BlockLayout(anchors[:, :16], torch.ones(1, 16, dtype=torch.bool), 3072, 16))
    assert not recomputes_tiles(BlockLayout(anchors, torch.ones_like(anchors, dtype=torch.bool), 3072, 16, recompute_tiles=False))


def test_flex_forward_equals_dense_on_cpu():
    # torch 2.13 has no FlexAttention backward on CPU: the forward pins down the mask_mod's rules.
    anchors, valid, context_length = _layout([45, 17], [8, 3], 4, seed=5)
    dense = BlockLayout(anchors, valid, context_length, 4, mode="dense")
    flex = dense.with_mode("flex")
    query, key, value = (tensor.detach() for tensor in _attention_inputs(dense, 4, 2, 8, seed=4))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is the unfused reference
        expected = block_attention(query, key, value, dense, 0.35)
        actual = block_attention(query, key, value, flex, 0.35)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_choose_attention_rules():
    assert choose_attention("auto", "cpu") == "sparse"
    # CUDA's rule is chosen by name only (no kernel runs): flex measured fastest on an H200, dense with dropout.
    assert choose_attention("auto", "cuda") == "flex"
    assert choose_attention("auto", "cuda", dropout=0.1) == "dense"
    assert choose_attention("dense", "cpu") == "dense"
    with pytest.raises(InputError, match="flex needs a CUDA device"):
        choose_attention("flex", "cpu")
    with pytest.raises(InputError, match="attention must be one of"):
        choose_attention("blocky", "cpu")


def test_layout_rejects_a_mismatched_call():
    layout = BlockLayout(torch.tensor([[2]]), torch.tensor([[True]]), 5, 4)
    query, key, value = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8)
    with pytest.raises(ValueError, match="1 blocks of 4 over a context of 5"):
        block_attention(query, key, value, layout, 1.0)


def test_drafter_with_sparse_layout_equals_dense_mask(tiny_target, tiny_drafter_config):
    # Through the real drafter: q/k-norm, RoPE at the block positions, GQA (4 heads over 2).
    from draftsmith.train.blocks import build_block_batch

    config = build_drafter_config(
        tiny_target.config, num_draft_layers=2, block_size=8, mask_token_id=tiny_drafter_config.mask_token_id
    )
    assert config.num_attention_heads > config.num_key_value_heads
    torch.manual_seed(0)
    model = DFlashDraftModel(config).train()
    generator = torch.Generator().manual_seed(7)
    sequences = []
    for length, anchors in ((30, [2, 9, 17, 28]), (6, [1, 4]), (19, [0, 5, 6])):
        ids = torch.randint(10, 1000, (length,), generator=generator)
        sequences.append((ids, torch.ones(length), torch.tensor(anchors)))
    batch = build_block_batch(sequences, config.block_size, config.mask_token_id)
    hidden_size = config.hidden_size
    features = torch.randn(3, batch.context_ids.shape[1], len(config.target_layer_ids) * hidden_size, generator=generator)
    noise = torch.randn(3, batch.noise_ids.shape[1], hidden_size, generator=generator)

    def run(attention_mask):
        model.zero_grad(set_to_none=True)
        hidden = model(position_ids=batch.position_ids, attention_mask=attention_mask, noise_embedding=noise, target_hidden=features)
        (hidden * torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
        return hidden.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    dense_hidden, dense_grads = run(batch.attention_mask)
    # Tiles of two blocks: three tiles, the last one all padding for two of the sequences.
    layout = BlockLayout(batch.anchors, batch.anchor_valid, batch.context_ids.shape[1], config.block_size, tile_queries=16)
    sparse_hidden, sparse_grads = run(layout)
    torch.testing.assert_close(sparse_hidden, dense_hidden, rtol=1e-5, atol=1e-5)
    assert dense_grads.keys() == sparse_grads.keys()
    for name in dense_grads:
        torch.testing.assert_close(sparse_grads[name], dense_grads[name], rtol=1e-5, atol=1e-5, msg=name)


class _HostSyncs(torch.overrides.TorchFunctionMode):
    """Counts the calls that make the host wait for a tensor's value (a device sync on CUDA)."""

    SYNCS = {"tolist", "item", "__int__", "__float__", "__bool__", "__index__", "nonzero"}

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.SYNCS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_the_tile_plan_waits_on_the_device_once_per_micro_batch():
    anchors, valid, context = _layout([300, 120, 77], [60, 25, 0], 4, seed=5)
    layout = BlockLayout(anchors, valid, context, 4, tile_queries=8)  # 30 tiles of 2 blocks
    inputs = _attention_inputs(layout, 2, 1, 8, seed=6)
    with _HostSyncs() as first_layer:
        block_attention(*inputs, layout, 0.3)
    with _HostSyncs() as second_layer:
        block_attention(*inputs, layout, 0.3)
    assert first_layer.calls == ["tolist"]  # one wait for all 30 tiles' bounds
    assert second_layer.calls == []  # the plan is shared by every layer of the micro-batch
    from draftsmith.model.block_attention import _tile_plan

    plan = _tile_plan(layout)
    assert len(plan) == 30
    visible = torch.where(valid, anchors, 0)
    for start, end, prefix, _ in plan:  # each prefix is its tile's largest visible anchor
        assert prefix == int(visible[:, start:end].max())


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_under_bf16_autocast_q_and_k_reach_attention_in_bf16(mode, monkeypatch):
    import draftsmith.model.drafter as drafter_module
    from transformers import Qwen3Config

    target = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    config = build_drafter_config(target, num_draft_layers=2, block_size=4, mask_token_id=3)
    torch.manual_seed(0)
    model = DFlashDraftModel(config).train()
    assert model.layers[0].self_attn.q_norm.weight.dtype == torch.float32
    seen = []

    def recording(query, key, value, layout, scale, dropout_p=0.0, window=None):
        seen.append((query.dtype, key.dtype, value.dtype))
        return block_attention(query, key, value, layout, scale, dropout_p, window)

    monkeypatch.setattr(drafter_module, "block_attention", recording)
    anchors, valid = torch.tensor([[1, 5]]), torch.tensor([[True, True]])
    layout = BlockLayout(anchors, valid, 8, 4, mode=mode)
    features = torch.randn(1, 8, len(config.target_layer_ids) * 32)
    noise = torch.randn(1, 8, 32)
    positions = torch.cat([torch.arange(8), torch.arange(1, 5), torch.arange(5, 9)])[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model(position_ids=positions, attention_mask=layout, noise_embedding=noise, target_hidden=features)
    hidden.float().sum().backward()
    assert seen == [(torch.bfloat16,) * 3] * 2
    assert model.layers[0].self_attn.q_proj.weight.grad is not None


def _windowed_reference_mask(anchors, valid, context_length, block_size, window):
    """The window rule written out per query and key, independently of `_visible`: the query at
    position a+k sees context p < a with a+k-p < window, and its block's offsets within window-1."""
    batch, blocks = anchors.shape
    queries = blocks * block_size
    mask = torch.zeros(batch, 1, queries, context_length + queries, dtype=torch.bool)
    for s in range(batch):
        for n in range(blocks):
            a = int(anchors[s, n])
            for k in range(block_size):
                q = n * block_size + k
                for p in range(context_length):
                    mask[s, 0, q, p] = bool(valid[s, n]) and p < a and (a + k) - p < window
                for j in range(block_size):
                    mask[s, 0, q, context_length + n * block_size + j] = abs(k - j) < window
    return mask


@pytest.mark.parametrize("window", [4, 6, 11])
def test_a_sliding_window_hides_context_beyond_it_in_every_path(window):
    anchors, valid, context_length = _layout([40, 23], [9, 4], 4, seed=window)
    dense = BlockLayout(anchors, valid, context_length, 4, mode="dense")
    assert torch.equal(dense.dense_mask(window), _windowed_reference_mask(anchors, valid, context_length, 4, window))
    assert not torch.equal(dense.dense_mask(window), dense.dense_mask())  # the window cuts something here
    inputs = _attention_inputs(dense, 4, 2, 8, seed=2)
    expected, expected_grads = _run_windowed(dense, inputs, 0.35, window)
    for tiles, recompute in ((8, False), (8, True), (1024, None)):
        sparse = BlockLayout(anchors, valid, context_length, 4, tile_queries=tiles, recompute_tiles=recompute)
        actual, grads = _run_windowed(sparse, inputs, 0.35, window)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        for a, b in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    query, key, value = (tensor.detach() for tensor in inputs)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex = block_attention(query, key, value, dense.with_mode("flex"), 0.35, window=window)
    torch.testing.assert_close(flex, expected, rtol=1e-5, atol=1e-5)


def _run_windowed(layout, inputs, scale, window):
    output = block_attention(*inputs, layout, scale, window=window)
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(99))
    return output.detach(), torch.autograd.grad((output * weights).sum(), inputs)
