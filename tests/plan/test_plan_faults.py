"""Plans and labels that match what they describe: a drafter priced against a target it was not made
for is refused, DeepSeek fields that would plan another model (a 0 latent rank, a 0 or negative MoE
layer frequency, 0 experts picked 8 at a time) are refused or modelled as transformers builds them,
and a DSpark drafter is reported and priced as DSpark."""

from __future__ import annotations

import json

import pytest

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.evaluate.speculative import EvalReport
from draftsmith.plan.architecture import read_architecture
from test_plan_architecture import DEEPSEEK_V3, write_deepseek_v3
from test_plan_speculation import LAYERS, PROFILE, plan_of, qwen3


@pytest.fixture
def models(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(qwen3()))
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(qwen3(
        architectures=["DFlashDraftModel"], num_hidden_layers=1, block_size=8, num_target_layers=LAYERS,
        dflash_config={"mask_token_id": 3, "target_layer_ids": [1, 2], "target_architectures": ["Qwen3ForCausalLM"]},
        layer_types=["full_attention"])))
    return target, drafter


def _edit(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("dflash_"):
            config["dflash_config"][key.removeprefix("dflash_")] = value
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("target_change, drafter_change, named", [
    ({"hidden_size": 4096, "head_dim": 128}, {}, "hidden size 1024 (the target's is 4096)"),
    ({"vocab_size": 151936}, {}, "vocab_size 32000 (the target's is 151936)"),
    ({"num_hidden_layers": 2}, {}, "target_layer_ids [1, 2] (the target has 2 layers)"),
    ({"architectures": ["LlamaForCausalLM"]}, {}, "target_architectures ['Qwen3ForCausalLM'] (the target is "
                                                  "['LlamaForCausalLM'])"),
])
def test_a_drafter_made_for_another_target_is_refused_in_one_line(models, capsys, target_change, drafter_change, named):
    target, drafter = models
    _edit(target, **target_change)
    _edit(drafter, **drafter_change)
    with pytest.raises(InputError, match="made for another target than --model-config") as raised:
        plan_of(models)
    assert named in str(raised.value) and "\n" not in str(raised.value)
    argv = ["plan", "speculation", "--model-config", str(target), "--drafter", str(drafter), "--gpu", "h100",
            "--acceptance", "0.8,0.6", "--output-mean", "100"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err


def test_a_target_whose_architectures_is_a_string_still_matches(models):
    target, _ = models
    _edit(target, architectures="Qwen3ForCausalLM")
    assert plan_of(models).plans


@pytest.mark.parametrize("change, named", [
    ({"kv_lora_rank": 0}, "kv_lora_rank 0: MLA's compressed KV latent needs a rank of at least 1"),
    ({"moe_layer_freq": 0}, "moe_layer_freq must be a positive integer, got 0"),
    ({"moe_layer_freq": -1}, "moe_layer_freq must be a positive integer, got -1"),
    ({"n_routed_experts": 0}, "n_routed_experts 0 with num_experts_per_tok 8: a token cannot pick 8 of no experts"),
])
def test_deepseek_fields_that_would_plan_another_model_are_refused(tmp_path, capsys, change, named):
    path = write_deepseek_v3(tmp_path)
    (path / "config.json").write_text(json.dumps({**DEEPSEEK_V3, **change}))
    with pytest.raises(InputError) as raised:
        read_architecture(path)
    assert str(raised.value) == f"{path / 'config.json'}: {named}" or named in str(raised.value), raised.value
    assert main(["plan", "engine", "--model-config", str(path), "--gpu", "h100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err


def test_moe_layer_freq_routes_every_nth_layer_as_transformers_builds_deepseek(tmp_path):
    path = write_deepseek_v3(tmp_path)
    (path / "config.json").write_text(json.dumps({**DEEPSEEK_V3, "moe_layer_freq": 2}))
    arch = read_architecture(path)
    # transformers DeepseekV3: layer i routes when i >= first_k_dense_replace (3) and i % moe_layer_freq == 0.
    assert arch.moe_layers == len([i for i in range(61) if i >= 3 and i % 2 == 0]) == 29


def _dspark_export(drafter, block=8, rank=16):
    _edit(drafter, architectures=["Qwen3DSparkModel"], block_size=block, markov_rank=rank, markov_head_type="vanilla",
          draft_vocab_size=32000, enable_confidence_head=True, confidence_head_with_markov=True)


def test_a_dspark_drafter_is_priced_as_dspark_with_its_block_of_drafts(models):
    target, drafter = models
    dflash = plan_of(models, acceptance=",".join(map(str, PROFILE + [0.02])), concurrency="1")
    _dspark_export(drafter)
    dspark = plan_of(models, acceptance=",".join(map(str, PROFILE + [0.02])), concurrency="1")
    assert dspark.drafter_variant == "dspark" and dflash.drafter_variant == "dflash"
    # DSpark drafts block_size tokens (from the anchor), DFlash block_size - 1.
    assert [o.draft_tokens for o in dspark.plans[0].drafter] == list(range(1, 9))
    assert [o.draft_tokens for o in dflash.plans[0].drafter] == list(range(1, 8))
    # At the same K its step pays the Markov head (r x V per drafted token) on top of DFlash's forward.
    for ours, theirs in zip(dspark.plans[0].drafter, dflash.plans[0].drafter):
        assert ours.method == "dspark" and ours.drafter_step_s > 0 and theirs.drafter_step_s > 0


def test_eval_json_of_a_dspark_drafter_says_dspark_and_plan_reads_it(models, tmp_path):
    target, drafter = models
    _dspark_export(drafter)
    report = EvalReport(tau=2.0, acceptance_histogram={}, block_size=8, verify_tokens=9, num_prompts=1,
                        total_new_tokens=10, total_cycles=5, speculative_tokens_per_s=1.0, target_tokens_per_s=1.0,
                        speedup=1.0, lossless=True, mismatched_prompts=[], max_new_tokens=10, per_prompt=[],
                        per_position_acceptance=PROFILE + [0.02], method="dspark")
    path = tmp_path / "eval.json"
    path.write_text(report.to_json())
    plan = plan_of(models, acceptance=None, acceptance_from=str(path), concurrency="1")
    assert plan.drafter_variant == "dspark" and plan.acceptance.per_position == PROFILE + [0.02]
    assert [o.draft_tokens for o in plan.plans[0].drafter] == list(range(1, 9))
