"""A drafter with its own mask embedding, served by vLLM CPU's DFlash path from mask_embedding.pt.

The target (tiny Mistral-v0.1-like: no pad, no reserved id, no padding row) leaves no spare id, so
the drafter trains a mask vector in place of eos's row. The overfit gate's drafter is served: vLLM
must accept, per held-out prompt and draft position, what draftsmith does in process, which holds
only if vLLM puts the same vector at the same positions. Without mask_embedding.pt vLLM feeds eos's
row there and the gate must fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.gates.overfit import TOLERANCE, engine_verdict, prepare_overfit
from draftsmith.tiny.families import build_family_target

pytestmark = pytest.mark.timeout(1800)


def _spec(export: str | Path, block_size: int) -> list[str]:
    return ["--speculative-config",
            json.dumps({"method": "dflash", "model": str(export), "num_speculative_tokens": block_size - 1})]


def test_vllm_serves_the_mask_embedding_as_draftsmith_trained_it(start_vllm, tmp_path, capsys):
    target = build_family_target("mistral-nopad", tmp_path / "target", num_attention_heads=2, head_dim=32)
    prepared = prepare_overfit(target, tmp_path / "gate", steps=360)  # this random target learns slower
    assert json.loads((Path(prepared.export_dir) / "config.json").read_text())["dflash_config"][
        "mask_token_source"] == "drafter_embedding"
    # The gate plants the mask fault of such a drafter as a missing mask_embedding.pt: in process it must show.
    without = Path(prepared.planted_faults["mask token off by one"]["dir"])
    assert not (without / "mask_embedding.pt").exists()
    assert prepared.planted_faults["mask token off by one"]["disagreement"] > 3 * TOLERANCE, prepared.planted_faults

    server = start_vllm(target, "mask-embedding", extra_args=_spec(prepared.export_dir, prepared.block_size),
                        max_model_len=512)  # the tiny family targets hold 512 positions
    good = engine_verdict(prepared, server.api_url)
    server.stop()

    server = start_vllm(target, "no-mask-embedding", extra_args=_spec(without, prepared.block_size), max_model_len=512)
    bad = engine_verdict(prepared, server.api_url)
    server.stop()

    with capsys.disabled():
        print(f"\nmask embedding (block size {prepared.block_size}): in-process tau {prepared.in_process_tau:.2f} "
              f"({prepared.in_process_tau_engine_counting:.2f} counted as vLLM does); vLLM tau with "
              f"mask_embedding.pt {good['engine_tau']:.2f}, {good['verdict']}; without it vLLM tau "
              f"{bad['engine_tau']:.2f}, disagreement {bad['disagreement']:.1%}")
    assert good["disagreement"] <= TOLERANCE, good
    assert bad["disagreement"] > 3 * TOLERANCE, bad
