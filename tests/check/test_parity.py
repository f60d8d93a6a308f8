"""Logit parity with the reference `dflash` package, and the guard that makes its absence fail in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.check.parity import ATOL, logit_parity
from draftsmith.export import export_drafter
from draftsmith.model import DFlashDraftModel, build_drafter_config

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def perturbed_export(tiny_target_dir, tmp_path_factory):
    from transformers import AutoConfig

    torch.manual_seed(3)
    config = build_drafter_config(AutoConfig.from_pretrained(tiny_target_dir), num_draft_layers=2, block_size=8,
                                  mask_token_id=3)
    model = DFlashDraftModel(config)
    with torch.no_grad():  # untrained norms are all ones: perturb so a swapped tensor shows
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return export_drafter(model.eval(), tmp_path_factory.mktemp("parity") / "export", check_reference=False).path


def test_block_logits_match_the_reference_on_real_target_features(dflash_reference, perturbed_export, tiny_target_dir,
                                                                  tiny_tokenizer):
    result = logit_parity(perturbed_export, tiny_target_dir, tokenizer=tiny_tokenizer)
    assert result.status == "passed", result.detail
    assert result.max_abs_diff is not None and result.max_abs_diff <= ATOL
    assert result.block_size == 8 and result.context_tokens > 10  # a real chat prompt, not a stub
    assert "argmax identical" in result.detail


def test_a_missing_reference_fails_under_ci_instead_of_skipping(tmp_path):
    # A `dflash` that cannot be imported shadows the installed one, as on a machine without it.
    fake = tmp_path / "shadow" / "dflash"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('dflash is not installed here')\n")
    src = Path(__import__("draftsmith").__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(src)]), "CI": "true"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(HERE.parents[1]),
               f"{HERE / 'test_parity.py'}::test_block_logits_match_the_reference_on_real_target_features"]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=HERE.parents[1])
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output[-3000:]
    assert "required under CI=true" in output and "dflash is not installed here" in output
    skipped = subprocess.run(command, env={**env, "CI": ""}, capture_output=True, text=True, timeout=600,
                             cwd=HERE.parents[1])
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
