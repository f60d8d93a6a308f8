"""The regenerated tiny-target data set every training test shares (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftsmith.tiny import synthetic_prompts
from regenerate import regenerate_locally


@pytest.fixture(scope="session")
def regenerated(tmp_path_factory, tiny_target_dir) -> Path:
    out = tmp_path_factory.mktemp("regenerated") / "tokenized"
    torch.set_num_threads(1)
    regenerate_locally(tiny_target_dir, synthetic_prompts(24, seed=11), out, max_new_tokens=96, batch_size=24)
    return out
