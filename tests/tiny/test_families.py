"""Architecture generality without downloads: a tiny random-weight target of each released family
(Llama 3.x, Qwen2.5, Qwen3, Gemma 3, Mistral) goes train -> eval (lossless) -> export -> check."""

from __future__ import annotations

import pytest
import torch

from draftsmith.tiny.families import FAMILIES, build_family_target


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_trains_evaluates_exports_and_checks_clean(family, tmp_path):
    from draftsmith.check.config import CheckConfig
    from draftsmith.check.runner import check_export
    from draftsmith.gates.overfit import prepare_overfit

    target = build_family_target(family, tmp_path / "target")
    # train (a few steps) -> export -> eval, strict: a speculative output that differs from plain greedy raises.
    prepared = prepare_overfit(target, tmp_path / "run", samples=1, steps=3, max_new_tokens=12)
    assert prepared.new_tokens > 0
    summary = check_export(CheckConfig(export=prepared.export_dir, target=target, parity=True))
    problems = [f.line() for f in summary.findings if f.severity in ("error", "warning")]
    assert problems == [], problems
