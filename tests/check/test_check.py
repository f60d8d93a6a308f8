"""`draftsmith check` on a real export: clean on the demo's, and every planted fault named (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.check import template_sha256
from draftsmith.cli import main


def _edit_config(export: Path, **changes) -> dict:
    config = json.loads((export / "config.json").read_text())
    for key, value in changes.items():
        if key.startswith("dflash_"):
            config["dflash_config"][key.removeprefix("dflash_")] = value
        elif value is None and key.startswith("drop_"):
            config.pop(key.removeprefix("drop_"), None)
        else:
            config[key] = value
    (export / "config.json").write_text(json.dumps(config, indent=2))
    return config


def _add_tensor(export: Path, name: str, tensor: torch.Tensor) -> None:
    weights = load_file(str(export / "model.safetensors"))
    weights[name] = tensor.contiguous()
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})


def _target_tensor(target: Path, name: str) -> torch.Tensor:
    return load_file(str(target / "model.safetensors"))[name]


def _run(capsys, export: Path, target: Path, *extra: str) -> tuple[int, list[str]]:
    code = main(["check", str(export), "--target", str(target), *extra])
    captured = capsys.readouterr()
    # The thread choice is said on stderr once the inputs were read; the report's lines are the rest.
    said = [line for line in captured.err.splitlines() if not line.startswith("check: threads: ")]
    return code, captured.out.splitlines() + said


def test_the_demo_export_is_clean(small_demo, tiny_target_dir, capsys, dflash_reference):
    good_export = Path(small_demo.export_dir)
    code, lines = _run(capsys, good_export, tiny_target_dir)
    assert code == 0, lines
    assert not [line for line in lines if line.startswith("error:")]
    assert any(line.startswith("check: clean") for line in lines)
    block = json.loads((good_export / "config.json").read_text())["block_size"]
    assert f"serve: block_size {block} -> vLLM num_speculative_tokens {block - 1}, SGLang " \
           f"--speculative-num-draft-tokens {block}" in lines
    assert any(line.startswith("parity: passed: block logits max |diff|") for line in lines), lines
    assert main(["check", str(good_export), "--target", str(tiny_target_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "draftsmith.check" and report["parity"]["status"] == "passed"
    assert report["parity"]["max_abs_diff"] < 1e-4 and report["vllm_num_speculative_tokens"] == block - 1
    assert not [f for f in report["findings"] if f["severity"] == "error"]


def _shift(ids, by):
    return [i + by for i in ids]


def _plant_layers(export, target, by):
    ids = json.loads((export / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    _edit_config(export, dflash_target_layer_ids=_shift(ids, by))


def _plant_untied_head(export, target):
    # An exporter that assumed a tied target: the embedding table shipped as the drafter's head.
    _edit_config(export, tie_word_embeddings=True)
    _add_tensor(export, "embed_tokens.weight", _target_tensor(target, "model.embed_tokens.weight"))


def _plant_random_head(export, target):
    head = _target_tensor(target, "lm_head.weight")
    _add_tensor(export, "lm_head.weight", torch.randn_like(head) * head.std())


def _plant_rope(export, target):
    config = json.loads((export / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = config["rope_theta"] = 1_000_000.0
    (export / "config.json").write_text(json.dumps(config))


def _plant_block(export, target):
    config = json.loads((export / "config.json").read_text())
    _edit_config(export, block_size=config["block_size"] - 1)


PLANTED = {
    # fault: (plant, field named by the finding, extra flags)
    "layer ids shifted +1": (lambda e, t: _plant_layers(e, t, +1), "dflash_config.target_layer_ids", ()),
    "layer ids shifted -1": (lambda e, t: _plant_layers(e, t, -1), "dflash_config.target_layer_ids", ()),
    "layer count differs": (lambda e, t: _edit_config(e, num_target_layers=5), "num_target_layers", ()),
    "untied head": (_plant_untied_head, "tie_word_embeddings", ()),
    "random lm head": (_plant_random_head, "lm_head.weight", ()),
    "wrong mask token": (lambda e, t: _edit_config(e, dflash_mask_token_id=5), "dflash_config.mask_token_id", ()),
    "mask token outside vocab": (lambda e, t: _edit_config(e, dflash_mask_token_id=10**6),
                                 "dflash_config.mask_token_id", ()),
    "mask token's text changed": (lambda e, t: _edit_config(e, dflash_mask_token="<|reserved_special_token_9|>",
                                                            dflash_mask_token_source="reserved_token"),
                                  "dflash_config.mask_token", ()),
    "rope theta changed": (_plant_rope, "rope_parameters.rope_theta", ()),
    "legacy rope theta changed": (lambda e, t: _edit_config(e, rope_theta=500000.0), "rope_theta", ()),
    "block size off (config)": (_plant_block, "block_size", ()),
    "block size off (vLLM count)": (lambda e, t: None, "vLLM num_speculative_tokens", ("--num-speculative-tokens", "16")),
    "block size off (SGLang count)": (lambda e, t: None, "SGLang --speculative-num-draft-tokens",
                                      ("--sglang-draft-tokens", "17")),
    "feature definition changed": (lambda e, t: _edit_config(e, dflash_feature_definition="hf_hidden_states"),
                                   "dflash_config.feature_definition", ()),
    "hidden size differs": (lambda e, t: _edit_config(e, hidden_size=64), "hidden_size", ()),
    "weights cast to int64": (lambda e, t: _cast_weights(e, torch.int64), "model.safetensors dtype", ()),
    "config dtype the weights lack": (lambda e, t: _edit_config(e, dtype="bfloat16"), "dtype", ()),
    "mask vector cast to int64": (lambda e, t: _plant_mask_vector(e, torch.int64), "mask_embedding.pt dtype", ()),
}


def _cast_weights(export: Path, dtype: torch.dtype) -> None:
    weights = {name: tensor.to(dtype) for name, tensor in load_file(str(export / "model.safetensors")).items()}
    save_file(weights, str(export / "model.safetensors"), metadata={"format": "pt"})


def _plant_mask_vector(export: Path, dtype: torch.dtype) -> None:
    config = _edit_config(export, dflash_mask_token_source="drafter_embedding")
    vector = (torch.randn(config["hidden_size"]) * 3).to(dtype)
    torch.save({"mask_token_id": config["dflash_config"]["mask_token_id"], "embedding": vector},
               str(export / "mask_embedding.pt"))


@pytest.mark.parametrize("fault", list(PLANTED))
def test_a_planted_fault_is_named(fault, export_copy, tiny_target_dir, capsys):
    plant, field, flags = PLANTED[fault]
    export = export_copy()
    plant(export, tiny_target_dir)
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity", *flags)
    assert code == 1, lines
    errors = [line for line in lines if line.startswith("error:")]
    assert any(line.startswith(f"error: {field}: is ") and "; fix: " in line for line in errors), errors
    assert lines[-1].startswith("check: ") and "finding" in lines[-1]


def _sliding(export, window):
    _edit_config(export, layer_types=["sliding_attention"] * json.loads(
        (export / "config.json").read_text())["num_hidden_layers"], sliding_window=window, use_sliding_window=True)


def test_a_dropped_sliding_window_is_named(export_copy, tiny_target_dir, capsys):
    # The export records the windows it was trained with (full attention here): serving it with a
    # window, and causally as vLLM serves a sliding layer without is_causal false, are both errors.
    windowed = export_copy("windowed")
    _sliding(windowed, 64)
    code, lines = _run(capsys, windowed, tiny_target_dir, "--no-parity")
    assert code == 1, lines
    assert any(line.startswith("error: layer_types / sliding_window: is served windows [64") for line in lines), lines
    assert any(line.startswith("error: is_causal: is unset") for line in lines), lines

    dropped = export_copy("dropped")
    _sliding(dropped, None)
    code, lines = _run(capsys, dropped, tiny_target_dir, "--no-parity")
    assert code == 1 and any(line.startswith("error: sliding_window: is None") for line in lines), lines

    disabled = export_copy("disabled")
    _sliding(disabled, 64)
    _edit_config(disabled, use_sliding_window=False)
    code, lines = _run(capsys, disabled, tiny_target_dir, "--no-parity")
    assert code == 1 and any(line.startswith("error: use_sliding_window: is false") for line in lines), lines


def test_export_and_training_must_agree_on_the_window(export_copy, tiny_target_dir, capsys):
    layers = json.loads((export_copy("probe") / "config.json").read_text())["num_hidden_layers"]
    consistent = export_copy("consistent")  # as `train --draft-sliding-window 64` exports it
    _sliding(consistent, 64)
    _edit_config(consistent, is_causal=False, dflash_causal=False, dflash_trained_windows=[64] * layers)
    code, lines = _run(capsys, consistent, tiny_target_dir, "--no-parity")
    assert code == 0 and not [line for line in lines if "sliding" in line or "is_causal" in line], lines

    widened = export_copy("widened")  # trained with 64, config edited to serve 128
    _sliding(widened, 128)
    _edit_config(widened, is_causal=False, dflash_trained_windows=[64] * layers)
    code, lines = _run(capsys, widened, tiny_target_dir, "--no-parity")
    assert code == 1 and any(line.startswith("error: layer_types / sliding_window: is served windows [128")
                             and "the trained windows [64" in line for line in lines), lines

    full = export_copy("full")  # trained with a window, served with full attention
    _edit_config(full, dflash_trained_windows=[64] * layers)
    code, lines = _run(capsys, full, tiny_target_dir, "--no-parity")
    assert code == 1 and any(line.startswith("error: layer_types / sliding_window: is served windows [None") for line in lines), lines

    unrecorded = export_copy("unrecorded")  # a drafter from elsewhere: served windowed, training unknown
    _sliding(unrecorded, 64)
    _edit_config(unrecorded, is_causal=False, dflash_trained_windows=None)
    config = json.loads((unrecorded / "config.json").read_text())
    del config["dflash_config"]["trained_windows"]
    (unrecorded / "config.json").write_text(json.dumps(config))
    code, lines = _run(capsys, unrecorded, tiny_target_dir, "--no-parity")
    assert code == 0 and any(line.startswith("warning: dflash_config.trained_windows: is not recorded") for line in lines), lines


def test_parity_catches_what_only_one_implementation_honours(export_copy, tiny_target_dir, capsys, dflash_reference):
    # The reference runs sliding draft layers causally; draftsmith's model attends over the whole block.
    windowed = export_copy("windowed")
    _sliding(windowed, 64)
    code, lines = _run(capsys, windowed, tiny_target_dir)
    assert code == 1, lines
    assert any(line.startswith("error: block logits: is block logits max |diff|") for line in lines), lines
    assert any(line.startswith("parity: failed") for line in lines)


def test_template_and_thinking_mode_mismatches_warn(export_copy, tiny_target_dir, tiny_tokenizer, tmp_path, capsys):
    export = export_copy()
    trained = {"sha256": template_sha256(tiny_tokenizer.chat_template), "kwargs": {"enable_thinking": True}}
    _edit_config(export, dflash_template=trained)
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity", "--template-kwargs", '{"enable_thinking": true}')
    assert code == 0 and not [line for line in lines if line.startswith(("warning: chat", "error:"))], lines

    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity", "--template-kwargs", '{"enable_thinking": false}')
    assert code == 0, lines  # a warning: the user may mean it
    assert any(line.startswith("warning: chat_template_kwargs.enable_thinking: is False when serving, should be True")
               for line in lines), lines
    other = tmp_path / "other.jinja"
    other.write_text(tiny_tokenizer.chat_template.replace("<think>", "<thinking>"))
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity", "--chat-template", str(other),
                       "--template-kwargs", '{"enable_thinking": true}')
    assert code == 0 and any(line.startswith("warning: chat template sha256: is ") for line in lines), lines


def test_a_short_training_run_exports_clean(good_export, tiny_target_dir, capsys, dflash_reference):
    code, lines = _run(capsys, good_export, tiny_target_dir)
    assert code == 0 and any(line.startswith("parity: passed") for line in lines), lines


def test_bad_input_is_one_line_and_exit_2(tmp_path, good_export, tiny_target_dir, capsys):
    code, lines = _run(capsys, tmp_path / "missing", tiny_target_dir)
    assert code == 2 and lines == [f"draftsmith: error: {tmp_path / 'missing'}: export directory not found"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    code, lines = _run(capsys, broken, tiny_target_dir)
    assert code == 2 and len(lines) == 1 and "config.json:1: invalid JSON" in lines[0]
    code, lines = _run(capsys, good_export, tmp_path)
    assert code == 2 and len(lines) == 1 and "config.json: not found" in lines[0]


@pytest.mark.parametrize("change, field", [
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"layer_types": ["full_attention"] * 9}, "layer_types"),
    ({"block_size": 10**9, "dflash_block_size": 10**9}, "block_size"),
])
def test_an_impossible_config_is_named_not_a_traceback(change, field, export_copy, tiny_target_dir, capsys):
    """With parity on, a config no drafter can have is a finding (exit 1), never a crash or a huge allocation."""
    export = export_copy()
    _edit_config(export, **change)
    code, lines = _run(capsys, export, tiny_target_dir)
    assert code == 1, lines
    assert any(line.startswith(f"error: {field}: is ") for line in lines), lines
    assert not any("Traceback" in line for line in lines)


def test_a_float_export_of_another_float_type_is_clean_of_dtype_findings(export_copy, tiny_target_dir, capsys):
    export = export_copy()
    _cast_weights(export, torch.bfloat16)
    _edit_config(export, dtype="bfloat16")
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity")
    assert not [line for line in lines if "dtype" in line and line.startswith("error:")], lines


def test_each_installed_engine_says_whether_it_serves_the_target_family(small_demo, tiny_target_dir, tmp_path, capsys):
    """A Gemma 3 target: vLLM 0.32 has no EAGLE3 interface for it, so `check` must not look clean-and-servable."""
    from draftsmith.model.engine_install import EngineNotInstalled, vllm_python

    try:
        vllm_python()
    except EngineNotInstalled as error:
        pytest.skip(str(error))
    export = Path(small_demo.export_dir)
    code, lines = _run(capsys, export, tiny_target_dir, "--no-parity")
    assert any(line.startswith("engine: vLLM 0.") and ": can serve it: Qwen3ForCausalLM" in line for line in lines), lines
    gemma = tmp_path / "gemma-target"
    gemma.mkdir()
    for item in Path(tiny_target_dir).iterdir():
        if item.is_file():
            (gemma / item.name).symlink_to(item)
    (gemma / "config.json").unlink()
    config = json.loads((Path(tiny_target_dir) / "config.json").read_text())
    (gemma / "config.json").write_text(json.dumps({**config, "architectures": ["Gemma3ForCausalLM"]}))
    code, lines = _run(capsys, export, gemma, "--no-parity", "--json")
    report = json.loads("\n".join(line for line in lines if not line.startswith("check:")))
    vllm = next(engine for engine in report["engines"] if engine["engine"].startswith("vLLM"))
    assert vllm["status"] == "no" and "EAGLE3" in vllm["detail"]
    assert any(f["check"] == "engines" and f["severity"] == "warning" for f in report["findings"])
    assert "engines" in report["checks"]
