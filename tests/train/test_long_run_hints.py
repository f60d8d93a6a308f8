"""The long-run warning's hints say something true of this run: half its own block, or no block hint
where no smaller block exists."""

from __future__ import annotations

import pytest

from draftsmith.train.config import TrainConfig
from draftsmith.train.trainer import train_time_cuts


@pytest.mark.parametrize("block, hint", [
    (16, "--block-size (now 16; 8 halves the drafter's tokens per anchor)"),
    (8, "--block-size (now 8; 4 halves the drafter's tokens per anchor)"),
    (4, "--block-size (now 4; 2 halves the drafter's tokens per anchor)"),
    (3, None),
    (2, None),
])
def test_the_block_hint_halves_this_runs_block(block, hint):
    cuts = train_time_cuts(TrainConfig(target="t", data="d", out="o", block_size=block), "float32")
    block_hints = [cut for cut in cuts if cut.startswith("--block-size")]
    assert block_hints == ([hint] if hint else [])
    assert any(cut.startswith("--num-anchors (now 512") for cut in cuts)
