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
    # The drafter itself must check clean on every family; whether an installed engine serves the family is
    # the engines' property (tests/check and tests/model/test_engine_support.py), not this drafter's.
    summary = check_export(CheckConfig(export=prepared.export_dir, target=target, parity=True, engines=False))
    problems = [f.line() for f in summary.findings if f.severity in ("error", "warning")]
    assert problems == [], problems


def test_a_scaled_embedding_feeds_the_drafter_its_bare_table_as_engines_do(tmp_path):
    from transformers import AutoModelForCausalLM

    from draftsmith.model import target_embed_tokens

    target = AutoModelForCausalLM.from_pretrained(build_family_target("gemma3", tmp_path / "gemma3"))
    ids = torch.tensor([[3, 7, 11]])
    scaled = target.get_input_embeddings()(ids)  # transformers folds Gemma's sqrt(hidden) into the module
    table = target.get_input_embeddings().weight[ids]
    assert not torch.allclose(scaled, table)
    # vLLM shares the target's embed_tokens with the drafter and applies Gemma's normalizer outside it.
    assert torch.equal(target_embed_tokens(target)(ids), table)
