"""The overfit gate's measurement without an engine: the disagreement it gates on and the faults it plants."""

from __future__ import annotations

import json

import pytest

from draftsmith.gates.overfit import FAULTS, disagreement, plant_fault


def test_disagreement_is_the_share_of_accepted_draft_tokens_that_differ_per_prompt_and_position():
    ours = {"a": [4, 3, 2, 0], "b": [2, 1, 1, 1]}  # [cycles, accepted at position 1, 2, 3]
    assert disagreement(ours, ours) == 0.0
    # Same totals per position across prompts, but swapped between prompts: a summed tau would agree.
    swapped = {"a": [4, 1, 1, 1], "b": [2, 3, 2, 0]}
    assert disagreement(ours, swapped) == pytest.approx((2 + 1 + 1 + 2 + 1 + 1) / 8)
    assert disagreement(ours, {"a": ours["a"]}) == pytest.approx(3 / 8)  # a prompt the engine never ran
    assert disagreement({"a": [3, 0, 0]}, {"a": [3, 0, 0]}) == 0.0
    assert disagreement({"a": [3, 0, 0]}, {"a": [3, 1, 0]}) == float("inf")


def test_each_planted_fault_changes_one_convention_in_a_copy(tmp_path):
    good_export = tmp_path / "export"
    good_export.mkdir()
    (good_export / "model.safetensors").write_bytes(b"weights travel with the copy")
    original = {"num_target_layers": 4, "rope_theta": 10000.0,
                "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
                "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 1, 2]}}
    (good_export / "config.json").write_text(json.dumps(original))
    planted = {fault: json.loads((plant_fault(good_export, fault, tmp_path / str(n)) / "config.json").read_text())
               for n, fault in enumerate(FAULTS)}
    ids, mask = original["dflash_config"]["target_layer_ids"], original["dflash_config"]["mask_token_id"]
    assert planted["layer ids shifted"]["dflash_config"]["target_layer_ids"] == [i + 1 for i in ids]
    assert planted["mask token off by one"]["dflash_config"]["mask_token_id"] == mask - 1
    rope = planted["rope theta x100"]
    assert rope["rope_theta"] == rope["rope_parameters"]["rope_theta"] == 100 * original["rope_theta"]
    for fault, config in planted.items():
        changed = {key for key in original if config[key] != original[key]}
        assert changed == ({"rope_theta", "rope_parameters"} if fault == "rope theta x100" else {"dflash_config"})
    assert json.loads((good_export / "config.json").read_text()) == original
    assert (tmp_path / "0" / "model.safetensors").read_bytes() == b"weights travel with the copy"
    last = {**original, "dflash_config": {"mask_token_id": 0, "target_layer_ids": [1, 2, 3]}}
    (good_export / "config.json").write_text(json.dumps(last))
    shifted = json.loads((plant_fault(good_export, FAULTS[0], tmp_path / "last") / "config.json").read_text())
    assert shifted["dflash_config"]["target_layer_ids"] == [0, 1, 2]  # the last layer: shifted down instead
    masked = json.loads((plant_fault(good_export, FAULTS[1], tmp_path / "mask0") / "config.json").read_text())
    assert masked["dflash_config"]["mask_token_id"] == 1
    with pytest.raises(ValueError, match="unknown fault"):
        plant_fault(good_export, "heads", tmp_path / "x")
