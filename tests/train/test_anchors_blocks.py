import torch

from draftsmith.train.anchors import anchor_generator, sample_anchors, valid_anchor_positions
from draftsmith.train.blocks import block_attention_mask, build_block_batch


def test_valid_anchors_are_response_tokens_followed_by_a_response_token():
    #            0  1  2  3  4  5  6  7  8  9
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 0, 1, 1, 0])
    assert valid_anchor_positions(mask).tolist() == [2, 3, 7]
    assert valid_anchor_positions(torch.tensor([1])).tolist() == []
    assert valid_anchor_positions(torch.tensor([0, 1, 0, 1])).tolist() == []


def test_sampled_anchors_stay_in_response_spans_and_are_capped():
    mask = torch.zeros(400, dtype=torch.int8)
    mask[50:120] = 1
    mask[200:380] = 1
    allowed = set(valid_anchor_positions(mask).tolist())
    anchors = sample_anchors(mask, 64, anchor_generator(0, 0, 3))
    assert anchors.numel() == 64
    assert len(set(anchors.tolist())) == 64
    assert anchors.tolist() == sorted(anchors.tolist())
    assert set(anchors.tolist()) <= allowed
    for anchor in anchors.tolist():
        assert mask[anchor] == 1 and mask[anchor + 1] == 1
    # Fewer candidates than the cap: every candidate is used.
    assert sample_anchors(mask, 10_000).tolist() == sorted(allowed)


def test_anchor_draws_are_reproducible_and_resampled_each_epoch():
    mask = torch.ones(300, dtype=torch.int8)
    first = sample_anchors(mask, 20, anchor_generator(5, 0, 7))
    again = sample_anchors(mask, 20, anchor_generator(5, 0, 7))
    next_epoch = sample_anchors(mask, 20, anchor_generator(5, 1, 7))
    other_sample = sample_anchors(mask, 20, anchor_generator(5, 0, 8))
    assert torch.equal(first, again)
    assert not torch.equal(first, next_epoch)
    assert not torch.equal(first, other_sample)


def test_anchors_cover_the_response_uniformly():
    mask = torch.zeros(100, dtype=torch.int8)
    mask[20:80] = 1  # valid anchors 20..78
    counts = torch.zeros(100)
    for draw in range(600):
        counts[sample_anchors(mask, 5, anchor_generator(1, draw, 0))] += 1
    valid = counts[20:79]
    assert counts[:20].sum() == 0 and counts[79:].sum() == 0
    # 600 draws x 5 anchors over 59 positions ~ 50.8 each; a gross bias would leave this band.
    assert valid.min() > 20 and valid.max() < 90


def test_block_mask_context_strictly_before_anchor_own_block_nothing_else():
    block_size, context_length = 3, 8
    anchors = torch.tensor([[2, 5]])
    mask = block_attention_mask(anchors, torch.tensor([[True, True]]), context_length, block_size)
    assert mask.shape == (1, 1, 6, 8 + 6)
    mask = mask[0, 0]
    for query in range(6):
        block = query // block_size
        anchor = anchors[0, block].item()
        for key in range(context_length):
            assert bool(mask[query, key]) == (key < anchor), (query, key)
        for key in range(6):
            assert bool(mask[query, context_length + key]) == (key // block_size == block), (query, key)


def test_padding_blocks_see_only_themselves():
    mask = block_attention_mask(torch.tensor([[4, 0]]), torch.tensor([[True, False]]), 6, 2)[0, 0]
    padding_rows = mask[2:4]
    assert not padding_rows[:, :6].any()
    assert padding_rows[:, 6:8].sum() == 0 and padding_rows[:, 8:10].all()


def test_block_batch_tokens_positions_and_labels():
    mask_id = 99
    input_ids = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    loss_mask = torch.tensor([0, 0, 1, 1, 1, 1, 0])
    batch = build_block_batch([(input_ids, loss_mask, torch.tensor([2, 5]))], block_size=4, mask_token_id=mask_id)
    assert batch.noise_ids.tolist() == [[12, mask_id, mask_id, mask_id, 15, mask_id, mask_id, mask_id]]
    assert batch.position_ids.tolist() == [list(range(7)) + [2, 3, 4, 5, 5, 6, 7, 8]]
    # Block at 2 predicts 13, 14, 15 (all response); block at 5 predicts 16 (not response) and two
    # positions past the end.
    assert batch.labels[0, 0].tolist() == [13, 14, 15]
    assert batch.label_mask[0].tolist() == [[1, 1, 1], [0, 0, 0]]
    assert batch.num_tokens == 7


def test_block_batch_pads_sequences_and_anchor_counts():
    first = (torch.arange(10), torch.ones(10), torch.tensor([1, 4, 6]))
    second = (torch.arange(5), torch.tensor([0, 1, 1, 1, 1]), torch.tensor([2]))
    batch = build_block_batch([first, second], block_size=3, mask_token_id=0)
    assert batch.context_ids.shape == (2, 10)
    assert batch.context_mask[1].tolist() == [1] * 5 + [0] * 5
    assert batch.attention_mask.shape == (2, 1, 9, 10 + 9)
    assert batch.anchor_valid.tolist() == [[True, True, True], [True, False, False]]
    assert batch.label_mask[1, 1:].sum() == 0
    assert batch.labels[1, 0].tolist() == [3, 4]


def test_anchor_coverage_counts_trainable_tokens_some_block_predicts():
    from draftsmith.train.blocks import build_block_batch

    # 12 tokens, the response from position 4 on (8 trainable); blocks of 4 predict anchor+1..anchor+3.
    mask = torch.tensor([0] * 4 + [1] * 8)
    ids = torch.arange(12)
    one = build_block_batch([(ids, mask, torch.tensor([5]))], 4, 99)
    assert (one.trainable_tokens, one.covered_tokens) == (8, 3)  # 6, 7, 8
    # Overlapping blocks count a token once; labels past the end are not tokens.
    two = build_block_batch([(ids, mask, torch.tensor([5, 6, 10]))], 4, 99)
    assert (two.trainable_tokens, two.covered_tokens) == (8, 5)  # 6..9 and 11
    # Per sequence: each sample (one document) keeps its own anchors; a prompt label is never covered.
    prompt_mask = torch.tensor([1] * 3 + [0] * 3 + [1] * 6)
    batch = build_block_batch([(ids, mask, torch.tensor([5])), (ids, prompt_mask, torch.tensor([1, 6]))], 4, 99)
    assert (batch.trainable_tokens, batch.covered_tokens) == (8 + 9, 3 + 1 + 3)  # 2; 7, 8, 9
    moved = batch.to(torch.device("cpu"))
    assert (moved.trainable_tokens, moved.covered_tokens) == (batch.trainable_tokens, batch.covered_tokens)
