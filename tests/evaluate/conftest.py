from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Tiny models on a shared 2-core machine: multi-threaded GEMMs stall on oversubscription
    # (10-40x slower here); one thread is both faster and steadier for timing comparisons.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    """The tiny target in float32, loaded once per test module."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
