from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors import safe_open

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.export import export_drafter
from draftsmith.model import (
    DFlashDraftModel,
    build_drafter_config,
    expected_weight_names,
    extract_target_features,
    load_drafter,
    save_drafter,
    target_embed_tokens,
    target_lm_head,
)
from draftsmith.tiny import synthetic_prompts


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(1)
    model = DFlashDraftModel(build_drafter_config(target.config, num_draft_layers=2, block_size=8, mask_token_id=3))
    # Untrained norms are all ones; perturb every parameter so a swapped or dropped tensor shows up.
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


def _real_inputs(target, tokenizer, drafter):
    row = next(iter(synthetic_prompts(1, seed=2)))
    text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    context = extract_target_features(target, ids[:, :-1], None, drafter.target_layer_ids)
    block = torch.full((1, drafter.block_size), drafter.mask_token_id)
    block[0, 0] = ids[0, -1]
    noise = target_embed_tokens(target)(block).detach()
    positions = torch.arange(context.shape[1] + drafter.block_size).unsqueeze(0)
    return ids, positions, noise, context


def test_export_writes_the_engine_format(tmp_path, drafter):
    source = save_drafter(drafter, tmp_path / "run" / "drafter")
    result = export_drafter(tmp_path / "run", tmp_path / "export")  # resolves <run>/drafter
    assert result.source == source
    assert result.files == ["README.md", "config.json", "model.safetensors"]
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"]["target_layer_ids"] == [0, 1, 2] and config["block_size"] == 8
    with safe_open(str(tmp_path / "export" / "model.safetensors"), framework="pt") as handle:
        assert set(handle.keys()) == expected_weight_names(drafter.config)
    assert result.max_abs_diff < 1e-5


def test_reference_package_reproduces_our_hidden_states_and_logits(tmp_path, target, tiny_tokenizer, drafter, dflash_reference):
    dflash = dflash_reference
    export_dir = export_drafter(drafter, tmp_path / "export").path
    reference = dflash.DFlashDraftModel.from_pretrained(
        str(export_dir), attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    assert reference.target_layer_ids == drafter.target_layer_ids
    assert reference.mask_token_id == drafter.mask_token_id and reference.block_size == drafter.block_size

    ids, positions, noise, context = _real_inputs(target, tiny_tokenizer, drafter)
    ours = load_drafter(export_dir)
    with torch.no_grad():
        our_hidden = ours(position_ids=positions, noise_embedding=noise, target_hidden=context)
        ref_hidden = reference(position_ids=positions, noise_embedding=noise, target_hidden=context)
        lm_head = target_lm_head(target)
        our_logits = ours.compute_logits(our_hidden, lm_head)
        ref_logits = reference.compute_logits(ref_hidden, lm_head)
    torch.testing.assert_close(our_hidden, ref_hidden, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(our_logits, ref_logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(our_logits.argmax(-1), ref_logits.argmax(-1))


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")
def test_reference_generate_matches_our_speculative_decoding(tmp_path, target, tiny_tokenizer, drafter, dflash_reference):
    dflash = dflash_reference
    from draftsmith.evaluate import speculative_decode

    export_dir = export_drafter(drafter, tmp_path / "export").path
    reference = dflash.DFlashDraftModel.from_pretrained(str(export_dir), attn_implementation="sdpa", dtype=torch.float32)
    ids = _real_inputs(target, tiny_tokenizer, drafter)[0]
    stop = [tiny_tokenizer.eos_token_id]
    ref_ids = reference.spec_generate(target, ids, max_new_tokens=24, stop_token_ids=stop)
    ours = speculative_decode(target, load_drafter(export_dir), ids, 24, stop)
    assert ref_ids[0, ids.shape[1] :].tolist() == ours.tokens


def test_export_bfloat16_and_refusals(tmp_path, drafter):
    result = export_drafter(drafter, tmp_path / "bf16", dtype="bfloat16")
    assert result.dtype == "bfloat16"
    assert load_drafter(result.path).fc.weight.dtype == torch.bfloat16
    assert drafter.fc.weight.dtype == torch.float32  # the source model is left as it was
    with pytest.raises(InputError, match="not empty"):
        export_drafter(drafter, tmp_path / "bf16")
    export_drafter(drafter, tmp_path / "bf16", overwrite=True)
    with pytest.raises(InputError, match="no drafter found"):
        export_drafter(tmp_path / "nothing-here", tmp_path / "x")
    broken = DFlashDraftModel(drafter.config)
    with torch.no_grad():
        broken.fc.weight[0, 0] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        export_drafter(broken, tmp_path / "nan")
    assert not (tmp_path / "nan").exists()


def test_cli_export(tmp_path, drafter, capsys):
    source = save_drafter(drafter, tmp_path / "ckpt")
    assert main(["export", "--drafter", str(source), "--out", str(tmp_path / "out")]) == 0
    assert "exported" in capsys.readouterr().out
    assert main(["export", "--drafter", str(source), "--out", str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err


def _attach_oracle(model, sequence, wrong_every):
    """Make `model` draft the known continuation (wrong at positions divisible by `wrong_every`)."""
    seen = {}

    def capture(module, args, kwargs):
        block = kwargs["noise_embedding"].shape[1]
        seen["positions"] = kwargs["position_ids"][0, -block:].tolist()

    def compute_logits(hidden, lm_head):
        logits = torch.zeros(1, hidden.shape[1], lm_head.weight.shape[0])
        for index, position in enumerate(seen["positions"][1:]):
            token = sequence[position] if position < len(sequence) else 0
            if position % wrong_every == 0:
                token = (token + 1) % lm_head.weight.shape[0]
            logits[0, index, token] = 1.0
        return logits

    model.register_forward_pre_hook(capture, with_kwargs=True)
    model.compute_logits = compute_logits
    return model


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")
def test_acceptance_lengths_match_the_reference_cycle_for_cycle(monkeypatch, tmp_path, target, tiny_tokenizer, drafter, dflash_reference):
    dflash = dflash_reference
    import time

    import dflash.model

    from draftsmith.evaluate import greedy_decode, speculative_decode

    # The reference times with torch.cuda.synchronize(); on CPU a plain clock does the same job.
    monkeypatch.setattr(dflash.model, "_cuda_time", time.perf_counter)
    export_dir = export_drafter(drafter, tmp_path / "export").path
    ids = _real_inputs(target, tiny_tokenizer, drafter)[0]
    stop = [tiny_tokenizer.eos_token_id]
    plain = greedy_decode(target, ids, 40, stop)
    sequence = ids[0].tolist() + plain.tokens
    reference = dflash.DFlashDraftModel.from_pretrained(str(export_dir), attn_implementation="sdpa", dtype=torch.float32)
    _attach_oracle(reference, sequence, wrong_every=4)
    ours = _attach_oracle(load_drafter(export_dir), sequence, wrong_every=4)

    stats = dflash.model.dflash_generate(reference.eval(), target, ids, 40, stop, return_stats=True)
    mine = speculative_decode(target, ours, ids, 40, stop)
    assert stats.output_ids[0, ids.shape[1] :].tolist() == mine.tokens == plain.tokens
    assert stats.acceptance_lengths == mine.acceptance_lengths
    assert max(mine.acceptance_lengths) > 2  # drafts really were accepted


def test_export_readme_gives_ready_serving_commands(tmp_path, drafter, capsys):
    result = export_drafter(drafter, tmp_path / "export")
    assert result.num_speculative_tokens == drafter.config.block_size - 1 == 7 and result.warnings == []
    card = (tmp_path / "export" / "README.md").read_text()
    assert '"num_speculative_tokens": 7' in card and f'"model": "<this dir>"' in card
    assert "--speculative-algorithm DFLASH --speculative-draft-model-path <this dir>" in card
    assert "--speculative-num-draft-tokens 8" in card
    # The module form: `vllm serve` fails on the CPU build that tests/engines runs.
    assert "python -m vllm.entrypoints.openai.api_server --model <target model> --speculative-config" in card
    assert "accepts a num_speculative_tokens larger than 7 without complaint" in card
    assert "num_speculative_tokens 7" in result.summary()
    assert "warning" not in capsys.readouterr().err


def test_export_warns_about_drafters_trained_on_the_old_last_layer_feature(tmp_path, target, capsys):
    # Defaults took the tiny target's last layer (3) then; they no longer do.
    old = DFlashDraftModel(build_drafter_config(target.config, num_draft_layers=1, block_size=8, mask_token_id=3,
                                                target_layer_ids=[0, 1, 2, 3]))
    source = save_drafter(old, tmp_path / "old")
    config = json.loads((source / "config.json").read_text())
    del config["dflash_config"]["feature_definition"]  # as written before the pre-norm definition
    (source / "config.json").write_text(json.dumps(config))
    assert main(["export", "--drafter", str(source), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "last layer (3)" in err and "before the norm" in err
    result = export_drafter(source, tmp_path / "again")
    assert len(result.warnings) == 1


def test_export_keeps_the_training_template_record(tmp_path, drafter):
    # train copies tokenize's manifest "template" into dflash_config.template; export must keep it.
    recorded = {"sha256": "ab" * 32, "kwargs": {"enable_thinking": False}}
    config = copy.deepcopy(drafter.config)  # the fixture's config stays as it is
    config.dflash_config = {**config.dflash_config, "template": recorded}
    model = DFlashDraftModel(config)
    model.load_state_dict(drafter.state_dict())
    source = save_drafter(model, tmp_path / "drafter")
    assert json.loads((source / "config.json").read_text())["dflash_config"]["template"] == recorded
    result = export_drafter(source, tmp_path / "export")
    exported = json.loads((result.path / "config.json").read_text())
    assert exported["dflash_config"]["template"] == recorded
    card = (result.path / "README.md").read_text()
    assert 'sha256 abababababababab... with kwargs {"enable_thinking": false}' in card
    plain = export_drafter(drafter, tmp_path / "plain")
    assert "chat template: not recorded" in (plain.path / "README.md").read_text()


def test_export_to_a_name_near_the_length_limit(tmp_path, drafter):
    """A legal 240-255-byte --out failed on its own lock and staging names (issue 34 item 9)."""
    for length in (240, 255):
        out = tmp_path / ("e" * length)
        result = export_drafter(drafter, out)
        assert result.path == out and (out / "model.safetensors").is_file()
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == sorted(
            p.name for p in tmp_path.iterdir() if p.name.endswith(".draftsmith.lock"))  # no staging left behind
        assert main(["status", "--json", str(out)]) == 0  # status finds the export's lock beside it


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated")
def test_a_sliding_window_round_trips_into_the_keys_engines_read(tmp_path, target, tiny_tokenizer, dflash_reference):
    # Trained with a window, exported with the keys vLLM's DFlash and the reference read (layer_types,
    # sliding_window, is_causal false), and decoded in process with that window: the reference
    # package, which reads those keys, drafts exactly what our speculative decoding drafts.
    from draftsmith.evaluate import speculative_decode
    from draftsmith.model.config import layer_windows

    torch.manual_seed(2)
    config = build_drafter_config(target.config, num_draft_layers=2, block_size=8, mask_token_id=3, sliding_window=8)
    windowed = DFlashDraftModel(config)
    with torch.no_grad():
        for parameter in windowed.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    result = export_drafter(windowed.eval(), tmp_path / "export")
    assert result.reference_check.startswith("passed")  # the probe's context is longer than the window
    written = json.loads((result.path / "config.json").read_text())
    assert written["layer_types"] == ["sliding_attention"] * 2 and written["sliding_window"] == 8
    assert written["use_sliding_window"] is True and written["is_causal"] is False
    assert written["dflash_config"]["causal"] is False and written["dflash_config"]["trained_windows"] == [8, 8]
    assert "sliding windows [8, 8]" in (result.path / "README.md").read_text()
    reloaded = load_drafter(result.path)
    assert layer_windows(reloaded.config) == [8, 8]

    reference = dflash_reference.DFlashDraftModel.from_pretrained(str(result.path), attn_implementation="sdpa", dtype=torch.float32)
    ids = _real_inputs(target, tiny_tokenizer, reloaded)[0]
    assert ids.shape[1] > 8  # the prompt alone is longer than the window
    stop = [tiny_tokenizer.eos_token_id]
    ref_ids = reference.spec_generate(target, ids, max_new_tokens=24, stop_token_ids=stop)
    ours = speculative_decode(target, reloaded, ids, 24, stop)
    assert ref_ids[0, ids.shape[1] :].tolist() == ours.tokens
    # The same weights without the window draft other blocks: the window is what made them agree.
    unwindowed = DFlashDraftModel(build_drafter_config(target.config, num_draft_layers=2, block_size=8, mask_token_id=3))
    unwindowed.load_state_dict(reloaded.state_dict())
    positions, noise, context = _real_inputs(target, tiny_tokenizer, reloaded)[1:]
    with torch.no_grad():
        a = reloaded(position_ids=positions, noise_embedding=noise, target_hidden=context)
        b = unwindowed.eval()(position_ids=positions, noise_embedding=noise, target_hidden=context)
        c = reference(position_ids=positions, noise_embedding=noise, target_hidden=context)
    assert (a - b).abs().max() > 1e-4
    torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-4)


def test_export_asks_the_installed_engines_and_writes_their_answer(tmp_path, drafter, capsys):
    from draftsmith.model.engine_install import EngineNotInstalled, vllm_python

    try:
        vllm_python()
    except EngineNotInstalled as error:
        pytest.skip(str(error))
    assert drafter.config.dflash_config["target_architectures"] == ["Qwen3ForCausalLM"]
    result = export_drafter(drafter, tmp_path / "out", check_engines=True)
    vllm = next(support for support in result.engines if support.engine.startswith("vLLM"))
    assert vllm.status == "yes", vllm
    card = (result.path / "README.md").read_text()
    assert "## Engines installed where it was exported" in card and vllm.line() in card
