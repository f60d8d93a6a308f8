"""`check` and the overfit gate on a DSpark export: clean as exported, each DSpark fault named, and the
gate trains a DSpark drafter of the export's shape with DSpark's own planted fault as well."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_check import _edit_config, _run

from draftsmith.export.exporter import export_drafter
from draftsmith.gates.overfit import DSPARK_FAULTS, FAULTS, _settings, faults_for, plant_fault, prepare_overfit
from draftsmith.gates.config import OverfitConfig
from draftsmith.model import load_drafter_config
from draftsmith.model.dspark import DSparkDraftModel, build_dspark_config


@pytest.fixture(scope="module")
def dspark_export(good_export, tmp_path_factory) -> Path:
    """The good export's shape as a DSpark drafter (rank 8, confidence head), random heads, exported."""
    config = build_dspark_config(load_drafter_config(good_export), markov_rank=8, confidence_head=True)
    torch.manual_seed(0)
    model = DSparkDraftModel(config).eval()
    with torch.no_grad():
        model.markov_head.markov_w2.weight.normal_(0, 0.1)
    return export_drafter(model, tmp_path_factory.mktemp("dspark") / "export", check_reference=False).path


def _drop_tensor(export: Path, name: str) -> None:
    weights = load_file(str(export / "model.safetensors"))
    weights.pop(name)
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})


def _copy(export: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(export, tmp_path / "copy"))


def test_a_dspark_export_is_clean_and_served_with_block_size_tokens(dspark_export, tiny_target_dir, capsys):
    code, lines = _run(capsys, dspark_export, tiny_target_dir, "--no-parity")
    assert code == 0, lines
    block = json.loads((dspark_export / "config.json").read_text())["block_size"]
    assert f"serve: block_size {block} -> vLLM num_speculative_tokens {block}, (DSpark: vLLM's dspark method)" in lines
    readme = (dspark_export / "README.md").read_text()
    assert f'"method": "dspark"' in readme and f'"num_speculative_tokens": {block}' in readme
    # DSpark's count is block_size: block_size + 1 is an error, block_size - 1 only verifies less.
    code, lines = _run(capsys, dspark_export, tiny_target_dir, "--no-parity", "--num-speculative-tokens", str(block + 1))
    assert code == 1 and any(line.startswith("error: vLLM num_speculative_tokens: is ") for line in lines), lines
    code, lines = _run(capsys, dspark_export, tiny_target_dir, "--no-parity", "--num-speculative-tokens", str(block - 1))
    assert code == 0 and any(line.startswith("warning: vLLM num_speculative_tokens") for line in lines), lines


DSPARK_PLANTED = {
    "markov rank changed": (lambda e: _edit_config(e, markov_rank=4), "markov_head.markov_w1.weight shape"),
    "markov rank above the vocabulary": (lambda e: _edit_config(e, markov_rank=10**7), "markov_rank"),
    "markov rank zero": (lambda e: _edit_config(e, markov_rank=0), "markov_rank"),
    "draft vocabulary smaller": (lambda e: _edit_config(e, draft_vocab_size=100), "draft_vocab_size"),
    "confidence head switched off": (lambda e: _edit_config(e, enable_confidence_head=False), "enable_confidence_head"),
    "markov_w2 missing": (lambda e: _drop_tensor(e, "markov_head.markov_w2.weight"), "markov_head.markov_w2.weight"),
    "mask embedding": (lambda e: _edit_config(e, dflash_mask_token_source="drafter_embedding"),
                       "dflash_config.mask_token_source"),
}


@pytest.mark.parametrize("fault", list(DSPARK_PLANTED))
def test_a_planted_dspark_fault_is_named(fault, dspark_export, tiny_target_dir, tmp_path, capsys):
    plant, field = DSPARK_PLANTED[fault]
    export = _copy(dspark_export, tmp_path)
    plant(export)
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity")
    assert code == 1, lines
    errors = [line for line in lines if line.startswith("error:")]
    assert any(line.startswith(f"error: {field}: is ") and "; fix: " in line for line in errors), errors


def test_the_overfit_gate_plants_the_markov_fault_on_a_dspark_export(dspark_export, good_export, tmp_path):
    settings = _settings(dspark_export, OverfitConfig(target=dspark_export, work=tmp_path))
    assert settings["drafter"] == "dspark" and settings["markov_rank"] == 8 and settings["confidence_head"] is True
    assert faults_for(settings) == DSPARK_FAULTS and faults_for(_settings(good_export, OverfitConfig(
        target=good_export, work=tmp_path))) == FAULTS
    dropped = plant_fault(dspark_export, "markov head dropped", tmp_path / "dropped")
    weights = load_file(str(dropped / "model.safetensors"))
    assert weights["markov_head.markov_w2.weight"].abs().sum() == 0
    assert load_file(str(dspark_export / "model.safetensors"))["markov_head.markov_w2.weight"].abs().sum() > 0


@pytest.mark.slow
def test_the_overfit_gate_trains_a_dspark_drafter_every_fault_moves(dspark_export, tiny_target_dir, tmp_path):
    prepared = prepare_overfit(tiny_target_dir, tmp_path / "gate", export=dspark_export, samples=8, steps=60,
                               max_new_tokens=32, eval_prompts=3)
    assert json.loads((Path(prepared.export_dir) / "config.json").read_text())["architectures"] == ["Qwen3DSparkModel"]
    assert set(prepared.planted_faults) == set(DSPARK_FAULTS)
    assert prepared.in_process_tau > 1.0
    assert '"method": "dspark"' in prepared.serve_command
    # Sensitivity is not asserted at these small settings: "layer ids shifted" moved nothing here
    # (disagreement 0.0, seen 2026-12-05). At the gate's defaults (160 prompts, 120 steps) it moved
    # 17.3% (margin 3.5x, README "check knows DSpark"), too slow a run for CI.
    assert all("disagreement" in result for result in prepared.planted_faults.values())
