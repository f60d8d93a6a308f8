"""Start-up checks over the tokenized set, vectorised: which samples can train, and the vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from draftsmith.core.errors import InputError
from draftsmith.data.tokenized import load_tokenized, write_tokenized
from draftsmith.train.data import check_vocabulary
from draftsmith.train.loader import _has_pair, trainable_indices

MASKS = [
    [0, 0, 1, 1, 0],  # a pair at 2-3
    [0, 1, 0, 1, 0],  # trained tokens, never two in a row
    [1],  # one token
    [0, 0, 0, 0, 1, 1],  # its pair lies past max_length=4
    [1, 1, 1, 1],
    [0, 0, 0],
]


@pytest.fixture
def tokenized(tmp_path):
    rows = [{"id": f"r{index}", "input_ids": [5 + index] * len(mask), "loss_mask": mask} for index, mask in enumerate(MASKS)]
    rows[4]["input_ids"] = [7, 7, 999, 7]
    write_tokenized(rows, tmp_path / "data", shard_rows=4)  # two shards
    return tmp_path / "data"


def test_trainable_indices_match_the_per_sample_rule(tokenized):
    for max_length in (None, 4):
        dataset = load_tokenized(tokenized, max_length=max_length)
        expected = [index for index, sample in enumerate(dataset) if _has_pair(np.asarray(sample.loss_mask))]
        assert trainable_indices(dataset).tolist() == expected
    assert trainable_indices(load_tokenized(tokenized)).tolist() == [0, 3, 4]
    assert trainable_indices(load_tokenized(tokenized, max_length=4)).tolist() == [0, 4]
    # Any sequence of samples (no memory-mapped shards) takes the same rule.
    assert trainable_indices(list(load_tokenized(tokenized))).tolist() == [0, 3, 4]


def test_vocabulary_check_uses_the_shard_maximum_and_names_the_sample(tokenized):
    dataset = load_tokenized(tokenized)
    assert dataset.max_token_id == 999
    check_vocabulary(dataset, 1000)
    with pytest.raises(InputError, match=r"sample 4 \(id r4\) has token id 999, outside the target's vocabulary of 999$"):
        check_vocabulary(dataset, 999)


def test_start_up_checks_read_no_sample(tokenized):
    # At 914k samples a pass that builds each sample costs minutes and the masks' pages; the
    # trainable selection and the vocabulary check read the shards' offsets and stats instead.
    from draftsmith.data.tokenized import TokenizedDataset

    class NoSampleReads(TokenizedDataset):
        def __getitem__(self, index):
            raise AssertionError(f"sample {index} was built")

        def __iter__(self):
            raise AssertionError("the samples were iterated")

    dataset = load_tokenized(tokenized)
    dataset.__class__ = NoSampleReads
    assert trainable_indices(dataset).tolist() == [0, 3, 4]
    check_vocabulary(dataset, 1000)
