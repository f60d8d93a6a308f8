from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Tiny models on a shared 2-core machine: multi-threaded GEMMs stall on oversubscription.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_target(tiny_target_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32)
    return model.eval()


@pytest.fixture()
def tiny_drafter_config(tiny_target, tiny_tokenizer):
    from draftsmith.model import build_drafter_config, ensure_mask_token

    return build_drafter_config(
        tiny_target.config, num_draft_layers=2, block_size=8, mask_token_id=ensure_mask_token(tiny_tokenizer)
    )
