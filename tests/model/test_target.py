"""The one target loader: straight to its device in the run's dtype, sharded checkpoints, and a
broken target directory refused with one line naming the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.core.errors import InputError
from draftsmith.model.target import (
    WEIGHTS_INDEX_FILE,
    load_embedding_and_head,
    load_target_config,
    load_target_model,
    weight_files,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def small_targets(tmp_path_factory) -> dict[str, Path]:
    """A real (random) Qwen3 target saved twice: one model.safetensors, and sharded with an index."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=0)
    root = tmp_path_factory.mktemp("targets")
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="40KB")
    return {"single": root / "single", "sharded": root / "sharded", "root": root}


def _copy(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    return destination


def test_the_sharded_target_loads_in_the_asked_dtype_and_equals_the_single_file(small_targets):
    assert (small_targets["sharded"] / WEIGHTS_INDEX_FILE).exists()
    assert len(weight_files(small_targets["sharded"])) > 1
    single = load_target_model(small_targets["single"], "cpu", torch.float32)
    sharded = load_target_model(small_targets["sharded"], torch.device("cpu"), torch.bfloat16)
    assert {p.dtype for p in sharded.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in sharded.parameters()} == {"cpu"}
    assert not any(p.requires_grad for p in sharded.parameters()) and not sharded.training
    for (name, a), (_, b) in zip(single.state_dict().items(), sharded.state_dict().items(), strict=True):
        assert torch.equal(a.to(torch.bfloat16), b), name
    ids = torch.tensor([[1, 5, 9, 30]])
    with torch.no_grad():
        assert torch.allclose(single(ids).logits, sharded.float()(ids).logits, atol=0.05)


def test_embedding_and_head_alone_equal_the_models(small_targets):
    model = load_target_model(small_targets["single"], "cpu", torch.float32)
    embedding, head = load_embedding_and_head(small_targets["sharded"], "cpu", torch.bfloat16)
    assert embedding.weight.dtype == head.weight.dtype == torch.bfloat16
    assert not embedding.weight.requires_grad and not head.weight.requires_grad
    assert torch.equal(embedding.weight, model.get_input_embeddings().weight.to(torch.bfloat16))
    assert torch.equal(head.weight, model.get_output_embeddings().weight.to(torch.bfloat16))
    assert not torch.equal(embedding.weight, head.weight)  # untied: the head is read, not the embedding


def test_a_truncated_safetensors_file_is_named(small_targets, tmp_path):
    target = _copy(small_targets["single"], tmp_path / "target")
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for load in (lambda: load_target_model(target, "cpu"), lambda: load_embedding_and_head(target, "cpu")):
        with pytest.raises(InputError, match=r"model\.safetensors: not a readable safetensors file.*truncated"):
            load()


def test_a_corrupt_header_and_a_missing_shard_are_named(small_targets, tmp_path):
    corrupt = _copy(small_targets["single"], tmp_path / "corrupt")
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\0" * 64)
    with pytest.raises(InputError, match=r"corrupt/model\.safetensors: not a readable safetensors file"):
        load_target_model(corrupt, "cpu")
    sharded = _copy(small_targets["sharded"], tmp_path / "sharded")
    shard = sorted(sharded.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(InputError, match=rf"{WEIGHTS_INDEX_FILE}: names shard {shard.name}, which is missing"):
        load_embedding_and_head(sharded, "cpu")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("config.json", '{"model_type": "qwen3",\n  "hidden_size": 32,,\n}', r"config\.json:2: invalid JSON"),
        ("config.json", '["qwen3"]', r"config\.json: expected a JSON object, found list"),
        ("config.json", '{"model_type": "no-such-model"}', r"config\.json: not a usable model config"),
        ("config.json", None, r"config\.json: vocab_size must be a positive integer"),
        ("generation_config.json", '{"eos_token_id": 2,', r"generation_config\.json:1: invalid JSON"),
        ("generation_config.json", '{"eos_token_id": "end"}', r"generation_config\.json: eos_token_id must be a token id"),
        ("generation_config.json", '{"eos_token_id": [2, -1]}', r"generation_config\.json: eos_token_id must be a token id"),
        ("generation_config.json", '{"temperature": "hot"}', r"generation_config\.json: temperature must be a number"),
    ],
)
def test_a_bad_config_or_generation_config_is_named(small_targets, tmp_path, name, text, message):
    target = _copy(small_targets["single"], tmp_path / "target")
    if text is None:  # a well-formed file with a value no model can have
        config = json.loads((target / name).read_text())
        text = json.dumps({**config, "vocab_size": 0})
    (target / name).write_text(text)
    with pytest.raises(InputError, match=message):
        load_target_config(target)
    with pytest.raises(InputError, match=message):
        load_target_model(target, "cpu")


def test_extract_on_a_truncated_target_exits_2_with_one_line(small_targets, tmp_path):
    target = _copy(small_targets["single"], tmp_path / "target")
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    env = dict(os.environ, PYTHONPATH=SRC)
    result = subprocess.run(
        [sys.executable, "-m", "draftsmith", "extract", "--target", str(target), "--data", str(tmp_path / "data"),
         "--out", str(tmp_path / "features")],
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{weights}: not a readable safetensors file" in lines[0]


def test_serve_on_a_truncated_target_exits_2_with_one_line(small_targets, tmp_path):
    # serve loads through the same loader: before, a cut download gave safetensors' traceback, exit 1.
    target = _copy(small_targets["single"], tmp_path / "target")
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    env = dict(os.environ, PYTHONPATH=SRC)
    result = subprocess.run([sys.executable, "-m", "draftsmith", "serve", "--model", str(target), "--port", "0"],
                            capture_output=True, text=True, env=env, timeout=240)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert f"{weights}: not a readable safetensors file" in lines[0]
