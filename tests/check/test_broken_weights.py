"""`check` on weights that are broken where shapes and configs cannot show it: NaN or Inf in any
tensor (with or without the reference package), a variant label that disagrees with the weights,
an unknown Markov head type, and parity over every head a DSpark drafter serves with."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_check import _edit_config, _run

from draftsmith.core.errors import InputError
from draftsmith.export.exporter import export_drafter
from draftsmith.model import load_drafter, load_drafter_config
from draftsmith.model.dspark import DSparkDraftModel, build_dspark_config


@pytest.fixture(scope="module")
def dspark_export(good_export, tmp_path_factory) -> Path:
    """The good export's shape as a DSpark drafter (rank 8, confidence head), random heads, exported."""
    config = build_dspark_config(load_drafter_config(good_export), markov_rank=8, confidence_head=True)
    torch.manual_seed(0)
    model = DSparkDraftModel(config).eval()
    with torch.no_grad():
        model.markov_head.markov_w2.weight.normal_(0, 0.1)
    return export_drafter(model, tmp_path_factory.mktemp("dspark-broken") / "export", check_reference=False).path


def _copy(export: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(export, tmp_path / name))


def _poison(export: Path, name: str, value: float = float("nan"), everywhere: bool = False) -> None:
    weights = load_file(str(export / "model.safetensors"))
    tensor = weights[name].clone()
    if everywhere:
        tensor.fill_(value)
    else:
        tensor.view(-1)[tensor.numel() // 2] = value
    weights[name] = tensor
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})


def _errors(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("error:")]


@pytest.mark.parametrize("name, value", [("fc.weight", float("nan")), ("layers.0.mlp.down_proj.weight", float("inf")),
                                         ("norm.weight", float("-inf"))])
def test_one_non_finite_value_in_any_dflash_tensor_is_named(name, value, export_copy, tiny_target_dir, capsys):
    export = export_copy()
    _poison(export, name, value)
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity")  # what a machine without dflash sees
    assert code == 1, lines
    word = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[str(value)]
    assert any(line.startswith(f"error: {name}: is non-finite (1 {word} of ") for line in _errors(lines)), lines
    # Every path that loads the drafter (eval, export, parity) refuses it in one line too.
    with pytest.raises(InputError, match=rf"{re.escape(name)} holds non-finite values \(1 {re.escape(word)}") as raised:
        load_drafter(export)
    assert "\n" not in str(raised.value)


def test_with_the_reference_installed_parity_does_not_hide_a_nan(export_copy, tiny_target_dir, capsys, dflash_reference):
    export = export_copy()
    _poison(export, "fc.weight", everywhere=True)
    code, lines = _run(capsys, export, tiny_target_dir)
    assert code == 1 and any(line.startswith("error: fc.weight: is non-finite") for line in lines), lines
    assert "parity: skipped: the drafter cannot run on this target (see above)" in lines


@pytest.mark.parametrize("name", ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                                  "confidence_head.proj.weight", "confidence_head.proj.bias"])
def test_a_nan_dspark_head_is_named(name, dspark_export, tiny_target_dir, tmp_path, capsys):
    export = _copy(dspark_export, tmp_path)
    _poison(export, name, everywhere=True)
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity")
    assert code == 1, lines
    assert [line.split(":")[1].strip() for line in _errors(lines)] == [name], lines


def test_a_dspark_export_relabelled_dflash_is_an_error_and_its_engine_line_is_dflash(dspark_export, tiny_target_dir,
                                                                                     tmp_path, capsys):
    export = _copy(dspark_export, tmp_path)
    _edit_config(export, architectures=["DFlashDraftModel"])
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity")
    assert code == 1, lines
    relabelled = [line for line in _errors(lines) if line.startswith("error: architectures: is ['DFlashDraftModel']")]
    assert relabelled and "['Qwen3DSparkModel'] (model.safetensors holds confidence_head.proj.bias, " \
                          "confidence_head.proj.weight, markov_head.markov_w1.weight)" in relabelled[0], lines
    # Served as what the label says: DFlash's block count, and no engine line speaks of the DSpark class.
    block = json.loads((export / "config.json").read_text())["block_size"]
    assert any(line.startswith(f"serve: block_size {block} -> vLLM num_speculative_tokens {block - 1}") for line in lines)
    assert not [line for line in lines if line.startswith("engine:") and "Qwen3DSparkModel" in line], lines


def test_a_dflash_export_labelled_dspark_and_unknown_labels_are_errors(export_copy, tiny_target_dir, capsys):
    export = export_copy("dspark-label")
    _edit_config(export, architectures=["Qwen3DSparkModel"])
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity", "--no-engines")
    assert code == 1 and any(line.startswith("error: architectures: is ['Qwen3DSparkModel'], should be "
                                             "['DFlashDraftModel'] (no Markov head") for line in lines), lines
    export = export_copy("unknown-label")
    _edit_config(export, architectures=["LlamaForCausalLM"])
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity", "--no-engines")
    assert code == 1 and any(line.startswith("error: architectures: is ['LlamaForCausalLM'], should be "
                                             "['DFlashDraftModel'] or ['Qwen3DSparkModel']") for line in lines), lines


def test_an_unknown_markov_head_type_is_an_error(dspark_export, tiny_target_dir, tmp_path, capsys):
    export = _copy(dspark_export, tmp_path)
    _edit_config(export, markov_head_type="gated")
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity", "--no-engines")
    assert code == 1 and any(line.startswith("error: markov_head_type: is 'gated', should be 'vanilla'")
                             for line in _errors(lines)), lines


def test_a_markov_rank_edited_after_export_is_one_line_on_load(dspark_export, tmp_path):
    export = _copy(dspark_export, tmp_path)
    _edit_config(export, markov_rank=4)
    # The rank shapes three tensors (the confidence head, both Markov matrices): the first is named, with the count.
    with pytest.raises(InputError, match=r"confidence_head\.proj\.weight has shape \[1, \d+\], config\.json makes "
                                         r"it \[1, \d+\] \(and 2 more\); the weights belong to another config") as raised:
        load_drafter(export)
    assert "\n" not in str(raised.value) and "state_dict" not in str(raised.value)


def test_dspark_parity_covers_the_markov_and_confidence_heads(dspark_export, tiny_target_dir, tiny_tokenizer,
                                                              dflash_reference):
    from dflash import DFlashDraftModel as Reference

    from draftsmith.check.parity import dspark_head_parity, logit_parity
    from draftsmith.model.target import load_target_model

    result = logit_parity(dspark_export, tiny_target_dir, tokenizer=tiny_tokenizer)
    assert result.status == "passed", result.detail
    assert "Markov-biased logits max |diff|" in result.detail and "confidence logits max |diff|" in result.detail
    # The comparison can fail: a model whose heads differ from the export's tensors is caught per head.
    target = load_target_model(tiny_target_dir, "cpu", torch.float32)
    ours = load_drafter(dspark_export, dtype=torch.float32)
    reference = Reference.from_pretrained(str(dspark_export), attn_implementation="sdpa", dtype=torch.float32).eval()
    with torch.no_grad():
        ours.markov_head.markov_w2.weight.add_(0.01)
        ours.confidence_head.proj.bias.add_(0.01)
    heads = {head: close for head, close, _ in dspark_head_parity(ours, reference, dspark_export, target, tiny_tokenizer)}
    assert heads == {"Markov-biased logits": False, "confidence logits": False}


def test_a_target_whose_architectures_is_a_string_is_read_as_one_name(good_export, tiny_target_dir, tmp_path):
    import shutil as _shutil

    from draftsmith.check.inputs import ExportView, TargetView
    from draftsmith.check.runner import target_architectures

    target = Path(_shutil.copytree(tiny_target_dir, tmp_path / "target"))
    _edit_config(target, architectures="Qwen3ForCausalLM")
    export = ExportView.read(good_export)
    assert target_architectures(export, TargetView.read(target)) == ["Qwen3ForCausalLM"]
    _edit_config(target, architectures=["Qwen3ForCausalLM"])
    assert target_architectures(export, TargetView.read(target)) == ["Qwen3ForCausalLM"]
    _edit_config(target, drop_architectures=None)  # none given: what the drafter recorded
    assert target_architectures(export, TargetView.read(target)) == export.flash["target_architectures"]
