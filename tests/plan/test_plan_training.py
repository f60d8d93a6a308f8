"""`plan --train` on the seed's case: 914k samples of ~2,700 tokens, 6 epochs, a 27B target, 7 GPUs.

Every expected number below is written out from the formulas in `draftsmith.plan.training`'s
docstring, term by term, so a change to the code's arithmetic shows up here.
"""

import json

import pytest

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.model.shape import read_target_shape
from draftsmith.plan.training import make_train_plan

# A Qwen3 layout sized to ~27B: Qwen3-32B's attention (64 heads, 8 KV heads, head_dim 128) and
# width 5120 over 64 layers, with the MLP narrowed to 19,456 so the total lands at 26.7B.
QWEN3_27B_LIKE = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "intermediate_size": 19456,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
LAYER = 5120 * 8192 + 2 * 5120 * 1024 + 8192 * 5120 + 2 * 128 + 3 * 5120 * 19456 + 2 * 5120
TARGET = 64 * LAYER + 2 * 151936 * 5120 + 5120
DRAFTER = 5 * LAYER + 5 * 5120 * 5120 + 2 * 5120
SEED = ["--samples", "914k", "--mean-length", "2700", "--epochs", "6", "--num-anchors", "512",
        "--block-size", "16", "--gpus", "7", "--gpu", "H200"]


@pytest.fixture
def target_config(tmp_path):
    path = tmp_path / "target" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(QWEN3_27B_LIKE))
    return path


def seed_inputs(config, **changes):
    inputs = dict(samples=914_000, mean_length=2700, epochs=6, num_anchors=512, block_size=16, gpus=7,
                  gpu="H200", model_config_path=str(config))
    inputs.update(changes)
    return inputs


def test_parameter_counts_of_the_27b_like_target(target_config):
    shape = read_target_shape(target_config.parent)
    assert LAYER == 393_226_496
    assert shape.layer_params() == LAYER
    assert shape.params() == TARGET == 26_722_325_504
    plan = make_train_plan(seed_inputs(target_config))
    assert plan.drafter_params == DRAFTER == 2_097_214_720


def test_seed_case_wall_time_online(target_config):
    plan = make_train_plan(seed_inputs(target_config))
    sequences = 914_000 * 6
    target = 2 * 64 * LAYER * 2700 + 2 * 64 * 8192 * 2700**2
    linear = 6 * (512 * 16 * 5 * LAYER + 2700 * (5 * 5120 * 5120 + 5 * 2 * 5120 * 1024))
    lm_head = 4 * (512 * 15) * 151936 * 5120
    sparse_attention = 12 * 5 * 8192 * (512 * 16) * (2700 / 2 + 16)
    dense_attention = 12 * 5 * 8192 * (512 * 16) * (2700 + 512 * 16)
    sparse, dense = plan.times
    assert (sparse.attention, dense.attention) == ("sparse", "dense")
    assert sparse.flops_per_sequence.target_forward == pytest.approx(target, rel=1e-12)
    assert sparse.flops_per_sequence.drafter_linear == pytest.approx(linear, rel=1e-12)
    assert sparse.flops_per_sequence.drafter_lm_head == pytest.approx(lm_head, rel=1e-12)
    assert sparse.flops_per_sequence.drafter_attention == pytest.approx(sparse_attention, rel=1e-12)
    assert dense.flops_per_sequence.drafter_attention == pytest.approx(dense_attention, rel=1e-12)
    seconds = sequences * (target + linear + lm_head + sparse_attention) / (7 * 989e12 * 0.35)
    assert plan.headline == sparse
    assert sparse.wall_time.seconds == pytest.approx(seconds, rel=1e-12)
    assert round(sparse.wall_time.days, 1) == 7.1
    assert round(dense.wall_time.days, 1) == 8.1
    assert plan.total_tokens == sequences * 2700


def test_seed_case_memory_per_gpu(target_config):
    plan = make_train_plan(seed_inputs(target_config))
    sparse, dense = plan.memory
    t, q, m = 3072, 512 * 16, 512 * 15
    expected = {
        "target_weights": TARGET * 2,
        "target_activations": t * 65 * 5120 * 2 + t * (2 * 5120 + 3 * 19456) * 2,
        "features": t * 5 * 5120 * 2,
        "drafter_states": DRAFTER * 16,
        "drafter_activations": 2 * (5 * (q * (6 * 5120 + 4 * 19456) + (t + q) * 2 * (8192 + 1024)) + t * 5120),
        "logits": 1024 * 151936 * (2 + 4 + 4),  # one loss chunk of 1024 of the m scored rows
    }
    for key, value in expected.items():
        assert getattr(sparse, key) == getattr(dense, key) == value, key
    assert sparse.attention_workspace == 5 * 64 * q * (t / 2 + 16) * 2
    assert dense.attention_workspace == 5 * 64 * q * (t + q) * 2 + q * (t + q)
    assert sparse.total == sum(expected.values()) + sparse.attention_workspace
    assert sparse.fsdp_gathered == dense.fsdp_gathered == 0 and sparse.sharding == "ddp"
    assert round(sparse.total / 1e9, 1) == 110.3 and sparse.fits is True  # fits a 141 GB H200
    assert round(dense.total / 1e9, 1) == 161.3 and dense.fits is False
    assert not any("sparse plan needs" in warning for warning in plan.warnings)


def test_offline_drops_the_target_forward_and_weights(target_config):
    plan = make_train_plan(seed_inputs(target_config, offline=True))
    sparse = plan.times[0]
    assert plan.mode == "offline"
    assert sparse.flops_per_sequence.target_forward == 0
    assert plan.memory[0].target_weights == 2 * 151936 * 5120 * 2
    assert plan.memory[0].target_activations == 0
    online = make_train_plan(seed_inputs(target_config))
    assert sparse.wall_time.seconds < online.times[0].wall_time.seconds / 2


def test_measured_rate_from_a_train_benchmark(target_config, tmp_path):
    bench = tmp_path / "train_benchmark.json"
    bench.write_text(json.dumps({
        "kind": "draftsmith.train_benchmark", "version": 1, "mode": "online", "device": "cuda:0 NVIDIA H200",
        "world_size": 2, "steps": 20, "tokens_per_s": 8000.0, "samples_per_s": 2.9, "mean_tokens_per_sample": 2750.0,
        "peak_memory_bytes": 118_000_000_000,
        "shapes": {"block_size": 16, "num_anchors": 512, "num_draft_layers": 5, "batch_size": 1},
    }))
    plan = make_train_plan(seed_inputs(target_config, train_bench=str(bench)))
    assert plan.headline.source == "train-bench"
    assert plan.headline.tokens_per_s_per_gpu == 4000.0
    assert plan.headline.wall_time.seconds == pytest.approx(914_000 * 6 * 2700 / (4000 * 7))
    assert plan.warnings == []
    short = make_train_plan(seed_inputs(target_config, train_bench=str(bench), mean_length=1000, offline=True))
    assert any("ran online but this plan is offline" in w for w in short.warnings)
    assert any("2,750 tokens per sample" in w for w in short.warnings)
    other = make_train_plan(seed_inputs(target_config, train_bench=str(bench), draft_layers=1))
    assert [w for w in other.warnings if "num_draft_layers 5 but this plan has 1" in w]


def test_bad_train_benchmark_is_a_one_line_error(target_config, tmp_path):
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps({"kind": "draftsmith.bench", "version": 1}))
    with pytest.raises(InputError, match="b.json: field 'kind'"):
        make_train_plan(seed_inputs(target_config, train_bench=str(bench)))


def test_cli_prints_the_seed_case_with_its_inputs(target_config, capsys):
    assert main(["plan", "--train", *SEED, "--model-config", str(target_config)]) == 0
    out = capsys.readouterr().out
    for expected in ("Training plan (online)", "26,722,325,504 params", "2,097,214,720 trainable", "914,000 samples",
                     "2,700 tokens", "6 epochs", "512 anchors x block 16", "7 x H200", "MFU 0.35", "7.1 days",
                     "Memory per GPU", "attention workspace", "110.3", "161.3", "FSDP x7", "42.0"):
        assert expected in out, expected


def test_cli_json_and_config_file(target_config, tmp_path, capsys):
    plan_file = tmp_path / "train.yaml"
    plan_file.write_text("samples: 914k\noutput-mean: 2200\nprompt-mean: 500\ngpus: 7\ngpu: h200\n"
                         f"model-config: {target_config.parent.name}/config.json\n")
    assert main(["plan", "--train", "--config", str(plan_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "draftsmith.plan.train"
    assert data["inputs"]["mean_length"] == 2700
    assert data["target_params"] == TARGET
    assert round(data["headline"]["wall_time"]["days"], 1) == 7.1


def test_cli_missing_and_bad_inputs_exit_2(target_config, capsys):
    assert main(["plan", "--train", *SEED]) == 2
    assert "--model-config is required" in capsys.readouterr().err
    assert main(["plan", "--train", *SEED, "--model-config", str(target_config), "--gpu", "K80"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    assert main(["plan", "--train", "--samples", "10", "--model-config", str(target_config)]) == 2
    assert "--mean-length" in capsys.readouterr().err


def test_shallow_target_captures_each_layer_once(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_27B_LIKE, "num_hidden_layers": 3}))
    plan = make_train_plan(seed_inputs(path))
    assert plan.inputs["num_features"] == 3
    assert plan.drafter_params == 5 * LAYER + 3 * 5120 * 5120 + 2 * 5120
    assert any("planning on 3" in warning for warning in plan.warnings)


def test_fsdp_divides_the_target_and_drafter_states_and_adds_the_gathered_layers(target_config):
    # The seed's question: what fits on 8 x H100 80 GB.
    plan = make_train_plan(seed_inputs(target_config, gpus=8, gpu="H100"))
    ddp, fsdp = plan.memory[0], plan.memory_fsdp[0]
    assert (fsdp.sharding, fsdp.gpus, fsdp.attention) == ("fsdp", 8, "sparse")
    assert fsdp.target_weights == TARGET * 2 // 8
    assert fsdp.drafter_states == DRAFTER * 16 // 8
    assert fsdp.fsdp_gathered == 3 * LAYER * 4 + 151936 * 5120 * 2
    for same in ("target_activations", "features", "drafter_activations", "logits", "attention_workspace"):
        assert getattr(fsdp, same) == getattr(ddp, same), same
    assert fsdp.total == ddp.total - ddp.target_weights - ddp.drafter_states + fsdp.target_weights + fsdp.drafter_states + fsdp.fsdp_gathered
    assert ddp.fits is False and fsdp.fits is True  # 110.3 GB with DDP, 40.5 GB sharded over 8
    assert round(fsdp.total / 1e9, 1) == 40.5
    assert any("train with --sharding fsdp (40.5 GB per GPU over 8 GPUs)" in warning for warning in plan.warnings)
    assert plan.memory_fsdp[1].fits is False  # dense attention still does not fit


def test_plan_train_prints_the_fsdp_columns(target_config):
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "draftsmith", "plan", "train", "--samples", "914k", "--mean-length", "2700",
                             "--gpus", "8", "--gpu", "H100", "--model-config", str(target_config)],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "FSDP x8" in result.stdout and "FSDP gathered layers + LM head" in result.stdout


def test_a_cpu_train_benchmark_planning_a_gpu_run_is_warned_about(target_config, tmp_path):
    def plan_from(device: str, **overrides):
        bench = tmp_path / "train_benchmark.json"
        bench.write_text(json.dumps({
            "kind": "draftsmith.train_benchmark", "version": 1, "mode": "online", "device": device,
            "world_size": 1, "steps": 3, "tokens_per_s": 300.0, "samples_per_s": 0.1, "mean_tokens_per_sample": 2750.0,
            "shapes": {"block_size": 16, "num_anchors": 512, "num_draft_layers": 5, "batch_size": 1},
        }))
        return make_train_plan(seed_inputs(target_config, train_bench=str(bench), **overrides))

    cpu = plan_from("cpu (2 threads)")
    assert [w for w in cpu.warnings if "ran on cpu (2 threads), but this plans a run on H200 GPUs" in w], cpu.warnings
    assert plan_from("cuda:0 NVIDIA H200").warnings == []
    assert [w for w in plan_from("cuda:0 NVIDIA A100-SXM4-80GB").warnings if "this plan is for H200" in w]


def test_a_gemma3_target_counts_its_four_norms_per_layer(tmp_path):
    import torch
    import transformers

    # google/gemma-3-270m's text shape: the count the issue measured, 268,098,176 (268,075,136 with two norms).
    config = transformers.Gemma3TextConfig(hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                                           num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                                           tie_word_embeddings=True)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    expected = sum(parameter.numel() for parameter in model.parameters())
    assert expected == 268_098_176
    shape = read_target_shape(tmp_path)
    assert shape.params() == expected
    assert shape.target_layer_params() - shape.layer_params() == 2 * 640  # the drafter's layer keeps two norms
    plan = make_train_plan({"model_config_path": str(tmp_path), "samples": 1000, "mean_length": 512, "gpu": "h100"})
    assert plan.target_params == expected
