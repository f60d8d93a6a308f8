"""A drafter with its own mask embedding, served by vLLM CPU's DFlash path from mask_embedding.pt.

The target (tiny Mistral-v0.1-like: no pad, no reserved id, no padding row) leaves no spare id, so
the drafter trains a mask vector in place of eos's row. One sample is overfit; vLLM's tau on it must
be within 10% of draftsmith's in-process tau, which holds only if vLLM puts the same vector at the
same positions. Without mask_embedding.pt vLLM feeds eos's row there and the tau must fall.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from draftsmith.gates.overfit import MIN_FRACTION, engine_verdict, prepare_overfit
from draftsmith.tiny.families import build_family_target

pytestmark = pytest.mark.timeout(1800)


def _spec(export: str | Path, block_size: int) -> list[str]:
    return ["--speculative-config",
            json.dumps({"method": "dflash", "model": str(export), "num_speculative_tokens": block_size - 1})]


def test_vllm_serves_the_mask_embedding_as_draftsmith_trained_it(start_vllm, tmp_path, capsys):
    target = build_family_target("mistral-nopad", tmp_path / "target", num_attention_heads=2, head_dim=32)
    prepared = prepare_overfit(target, tmp_path / "gate", samples=1, steps=200, max_new_tokens=64)
    assert json.loads((Path(prepared.export_dir) / "config.json").read_text())["dflash_config"][
        "mask_token_source"] == "drafter_embedding"
    assert prepared.in_process_tau >= MIN_FRACTION * prepared.block_size, prepared

    server = start_vllm(target, "mask-embedding", extra_args=_spec(prepared.export_dir, prepared.block_size),
                        max_model_len=512)  # the tiny family targets hold 512 positions
    good = engine_verdict(prepared, server.api_url)
    server.stop()

    without = Path(shutil.copytree(prepared.export_dir, tmp_path / "without"))
    (without / "mask_embedding.pt").unlink()
    server = start_vllm(target, "no-mask-embedding", extra_args=_spec(without, prepared.block_size), max_model_len=512)
    bad = engine_verdict(prepared, server.api_url)
    server.stop()

    with capsys.disabled():
        print(f"\nmask embedding (block size {prepared.block_size}): in-process tau {prepared.in_process_tau:.2f} "
              f"({prepared.in_process_tau_engine_counting:.2f} counted as vLLM does); vLLM tau with "
              f"mask_embedding.pt {good['engine_tau']:.2f} -> {good['verdict']}; without it {bad['engine_tau']:.2f}")
    assert good["passed"] is True and good["gap"] <= 0.10, good
    assert bad["engine_tau"] < 0.9 * prepared.in_process_tau_engine_counting, bad
