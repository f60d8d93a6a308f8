"""Our DSpark export in vLLM's own `Qwen3DSparkForCausalLM` (vLLM 0.32 CPU, in its venv, as a subprocess).

vLLM's CPU build cannot serve DSpark end to end: its V1 model runner refuses the method ("Model
Runner V1 does not support: dspark speculative decoding") and the V2 runner, where the DSpark
speculator lives, needs Triton, which has no CPU backend. So the probe (dspark_vllm_probe.py) builds
the model class itself, loads our safetensors through its own `load_weights`, and drafts one block
greedily with the model's own methods from the backbone hidden states draftsmith computed. Checked:
every parameter vLLM keeps is filled by the export (only the embedding, shared from the target at
serving time, and vLLM's unused `mask_embedding` placeholder are not), the heads load bit-exact,
and the Markov-corrected block logits, the drafted tokens and the confidences equal ours. The
backbone is vLLM's DFlash model, which test_dflash_vllm.py serves end to end; the engine-tau row
for DSpark is in benchmarks/gpu_check.py for the first GPU.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import engine_unavailable

from draftsmith.engines import EngineNotInstalled, vllm_python
from draftsmith.export import export_drafter
from draftsmith.model import build_drafter_config, ensure_mask_token, extract_target_features, target_embed_tokens, target_lm_head
from draftsmith.model.dspark import DSparkDraftModel, build_dspark_config
from draftsmith.model.speculative import _draft_markov

pytestmark = pytest.mark.timeout(900)
PROBE = Path(__file__).with_name("dspark_vllm_probe.py")


@pytest.fixture(scope="module")
def python() -> Path:
    try:
        return vllm_python()
    except EngineNotInstalled as error:
        engine_unavailable(str(error))


def test_vllm_loads_our_dspark_export_and_drafts_the_same_block(python, tiny_target_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    config = build_drafter_config(target.config, num_draft_layers=1, block_size=5,
                                  mask_token_id=ensure_mask_token(tiny_tokenizer))
    torch.manual_seed(0)
    drafter = DSparkDraftModel(build_dspark_config(config, markov_rank=8))
    with torch.no_grad():  # perturb every parameter so a swapped or dropped tensor shows up
        for parameter in drafter.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    drafter.eval()
    export = export_drafter(drafter, tmp_path / "export", check_reference=False).path

    # Our block: target features of a prompt, queries [anchor, MASK x 4], the left-to-right greedy walk.
    ids = torch.tensor([[(7 * i + 11) % 1000 for i in range(20)]])
    context = extract_target_features(target, ids[:, :-1], None, list(drafter.target_layer_ids))
    block = torch.full((1, 6), drafter.mask_token_id)
    block[0, 0] = ids[0, -1]
    query = block[:, :5]
    with torch.no_grad():
        hidden = drafter(position_ids=torch.arange(context.shape[1] + 5).unsqueeze(0),
                         noise_embedding=target_embed_tokens(target)(query), target_hidden=context)[0]
        _draft_markov(drafter, hidden[None], block, target_lm_head(target), None, None)
        previous = block[0, :5]
        embeds = drafter.markov_embed(previous)
        ours_logits = drafter.markov_logits(drafter.compute_logits(hidden, target_lm_head(target)), embeds)
        ours_confidence = torch.sigmoid(drafter.confidence(hidden, embeds))
    inputs = tmp_path / "inputs.pt"
    torch.save({"hidden": hidden.clone(), "anchor": int(block[0, 0]), "lm_head": target.lm_head.weight.detach().clone()}, inputs)

    out = tmp_path / "vllm.pt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    result = subprocess.run([str(python), str(PROBE), str(tiny_target_dir), str(export), str(inputs), str(out)],
                            capture_output=True, text=True, timeout=800, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = torch.load(out)

    assert theirs["untouched"] == ["model.embed_tokens.weight", "model.mask_embedding"], theirs["untouched"]
    ours_heads = {f"model.{name}": tensor for name, tensor in drafter.state_dict().items() if "_head." in name}
    assert set(theirs["params"]) == set(ours_heads)
    for name, tensor in ours_heads.items():
        loaded = theirs["params"][name]  # markov_w2 is a ParallelLMHead: vLLM pads its vocabulary rows
        torch.testing.assert_close(loaded[: tensor.shape[0]], tensor, rtol=0, atol=0, msg=name)
        assert loaded.shape[1:] == tensor.shape[1:] and not loaded[tensor.shape[0]:].any(), name
    vocab = ours_logits.shape[-1]
    torch.testing.assert_close(theirs["logits"][:, :vocab], ours_logits, rtol=1e-4, atol=1e-4)
    assert theirs["tokens"] == block[0, 1:].tolist()
    torch.testing.assert_close(theirs["confidence"], ours_confidence, rtol=1e-5, atol=1e-5)
