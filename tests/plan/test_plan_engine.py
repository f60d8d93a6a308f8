"""`plan engine` on the seed case: the ceiling rebuilt by hand from ROOFLINE.md's worked example, the
share 400 tok/s is of it, the knobs, and bad input as one line naming its flag (exit 2)."""

from __future__ import annotations

import json
import math

import pytest

from draftsmith.cli import main
from draftsmith.plan.bench_result import bench_from_dict
from draftsmith.plan.config import EnginePlanConfig
from draftsmith.plan.engine import experts_touched, make_engine_plan
from tests.plan.test_plan_architecture import write_qwen36

SEED = ["--gpu", "rtx-pro-6000-server", "--gpus", "4", "--concurrency", "48", "--prompt-mean", "200",
        "--output-mean", "2500", "--samples", "914k", "--per-gpu", "400 tok/s"]


@pytest.fixture
def qwen36(tmp_path):
    return write_qwen36(tmp_path)


def plan_of(model, **values):
    settings = dict(model_config_path=str(model), gpu="rtx-pro-6000-server", gpus="4", concurrency="48",
                    prompt_mean="200", output_mean="2500", samples="914k", per_gpu="400 tok/s")
    settings.update(values)
    return make_engine_plan(EnginePlanConfig(**{k: v for k, v in settings.items() if v is not None}))


def test_seed_worked_example_by_hand(qwen36):
    # ROOFLINE.md: bf16, no speculation, B = 48, L = 200 + 2500/2, c = 2, RTX PRO 6000 Server (1,597 GB/s).
    hidden, vocab, layers = 5120, 248_320, 64
    attention = hidden * 2 * 24 * 256 + 2 * hidden * 4 * 256 + 24 * 256 * hidden + 2 * 256
    key, value = 16 * 128, 48 * 128
    deltanet = hidden * (2 * key + value) + hidden * value + hidden * 2 * 48 + value * hidden \
        + (2 * key + value) * 4 + 2 * 48 + 128
    mlp = 3 * hidden * 17408
    params = 16 * attention + 48 * deltanet + layers * (mlp + 2 * hidden) + hidden + 2 * vocab * hidden
    weights = (params - vocab * hidden) * 2  # the embedding is a gather, the LM head is read
    kv = 16 * 2 * 4 * 256 * 2
    state = 48 * 48 * 128 * 128 * 4 + 48 * 10240 * 3 * 2
    context = 200 + 2500 / 2
    decode_bytes = weights + 48 * context * kv + 2 * 48 * state
    # Prefill: 48/2500 sequences end per step and as many start, writing 200 prompt tokens of KV and a state.
    step_bytes = decode_bytes + 48 * 200 / 2500 * kv + 48 / 2500 * state
    ceiling = 48 / (step_bytes / 1597e9)

    plan = plan_of(qwen36)
    assert round(weights / 1e9, 2) == 51.25 and kv == 65_536 and round(state / 1e6, 1) == 153.9
    assert round(decode_bytes / 1e9, 1) == round(step_bytes / 1e9, 1) == 70.6 and round(ceiling) == 1086
    assert plan.weights_bytes_per_step == weights
    assert plan.kv_bytes_per_token == kv
    assert plan.state_bytes_per_sequence == state
    assert plan.mean_context == context and plan.batch == 48
    assert plan.step_time_bandwidth_s == pytest.approx(step_bytes / 1597e9, rel=1e-12)
    assert plan.bound == "bandwidth"
    assert plan.ceiling_tokens_per_s_per_gpu == pytest.approx(ceiling, rel=1e-12)
    assert plan.measured_share == pytest.approx(400 / ceiling, rel=1e-12)  # about a third
    assert plan.days_at_ceiling == pytest.approx(914_000 * 2500 / (ceiling * 4) / 86400, rel=1e-12)
    assert plan.days_at_efficiency == pytest.approx(plan.days_at_ceiling / 0.7, rel=1e-12)
    # Memory: 0.9 x 96 GB less every language-model weight (the embedding is resident), per sequence 1 state + L x kv.
    assert plan.max_batch == int((0.9 * 96e9 - params * 2) // (state + context * kv))


def test_fp8_weights_and_the_tuned_deployment(qwen36):
    fp8 = plan_of(qwen36, weights="fp8")
    # ROOFLINE.md: 26.93 GB in FP8 (the LM head and the narrow in_proj_a/b stay bf16, plus block scales).
    assert round(fp8.weights_bytes_per_step / 1e9, 2) == 26.93
    plan = plan_of(qwen36)
    tuned = next(knob for knob in plan.knobs if "tuned" in knob.knob)
    assert 400 / tuned.ceiling_tokens_per_s_per_gpu < 0.1  # under a tenth of what a tuned deployment allows
    assert [knob.ceiling_tokens_per_s_per_gpu for knob in plan.knobs] == sorted(
        (knob.ceiling_tokens_per_s_per_gpu for knob in plan.knobs), reverse=True)
    names = {knob.knob for knob in plan.knobs}
    assert {"FP8 weights", "FP8 KV cache", "bf16 linear-attention state", "concurrency up to the memory cap",
            "TP 4 (one replica)"} <= names
    assert all(knob.note for knob in plan.knobs)


def test_sglang_state_copies_and_its_speculative_cap(qwen36):
    radix = plan_of(qwen36, engine="sglang")
    assert radix.state_copies == 5
    state, kv, context = radix.state_bytes_per_sequence, 65_536, 1450
    resident = 26_895_998_464 * 2
    assert radix.max_batch == int((0.9 * 96e9 - resident) // (5 * state + context * kv)) == 37
    assert radix.batch == 37 and any("--concurrency 48 is more than fits (37" in w for w in radix.warnings)
    assert any(knob.knob.startswith("no prefix cache") for knob in radix.knobs)
    no_radix = plan_of(qwen36, engine="sglang", prefix_cache=False)
    assert no_radix.state_copies == 1 and no_radix.batch == 48
    mtp = plan_of(qwen36, engine="sglang", prefix_cache=False, speculative="mtp", draft_tokens="3", acceptance="2.5", weights="fp8",
                  concurrency="auto")
    assert mtp.state_copies == 1 + 3 and mtp.max_batch == 48  # SGLang resets max running requests to 48
    assert next(k for k in mtp.knobs if k.knob.startswith("concurrency")).batch > 48
    assert any(knob.knob == "speculation off (mtp)" for knob in mtp.knobs)


def test_speculation_terms(qwen36):
    plain = plan_of(qwen36, engine="ideal", concurrency="16")
    spec = plan_of(qwen36, engine="ideal", concurrency="16", speculative="mtp", draft_tokens="3", acceptance="3")
    # Batch 16 is bandwidth-bound: MTP reads the MTP layer and LM head 3 times more, accepts 3 tokens a step.
    assert spec.bound == plain.bound == "bandwidth"
    assert spec.ceiling_tokens_per_s_per_gpu > 2 * plain.ceiling_tokens_per_s_per_gpu


def test_longer_outputs_than_the_bench_change_the_batch_and_the_ceiling(qwen36, tmp_path):
    bench = {"kind": "draftsmith.bench", "version": 1, "engine": "sglang", "max_tokens": 1024,
             "results": [{"concurrency": 48, "output_tokens_per_s": 500.0, "mean_output_tokens": 1024}],
             "knee": {"concurrency": 48, "output_tokens_per_s": 500.0}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    assert bench_from_dict(bench).knee_mean_output_tokens == 1024
    plan = plan_of(qwen36, per_gpu=None, concurrency=None, bench=str(path), engine="sglang")
    info = plan.bench_context
    assert info["bench_mean_context"] == 200 + 512 and info["job_mean_context"] == 1450
    assert info["max_batch_at_job"] < info["max_batch_at_bench"]
    assert info["ceiling_at_job"] < info["ceiling_at_bench"]
    assert any("the bench measured 1,024-token outputs but this job's average 2,500" in w for w in plan.warnings)
    assert plan.measured_share == pytest.approx(500 / plan.ceiling_tokens_per_s_per_gpu)


def test_moe_reads_the_experts_the_batch_touches():
    assert experts_touched(128, 8, 1) == pytest.approx(8)
    assert experts_touched(128, 8, 48) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 48))
    assert experts_touched(128, 8, 10_000) == pytest.approx(128)


def test_output_length_tail_raises_the_live_context(qwen36, tmp_path):
    lengths = tmp_path / "pilot.jsonl"
    lengths.write_text("".join(json.dumps({"completion_tokens": n}) + "\n" for n in (1000, 1000, 1000, 7000)))
    plan = plan_of(qwen36, output_mean=None, output_lengths=f"{lengths}:completion_tokens")
    mean, square = 2500, (3 * 1000**2 + 7000**2) / 4
    assert plan.output_mean == mean and plan.mean_context == pytest.approx(200 + square / (2 * mean))


def test_json_is_strict_and_the_table_prints(qwen36, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["plan", "engine", "--model-config", str(qwen36), *SEED, "--json"]) == 0
    text = capsys.readouterr().out
    data = json.loads(text, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))
    assert data["kind"] == "draftsmith.plan.engine" and data["batch"] == 48
    assert {"knob", "ceiling_tokens_per_s_per_gpu", "days", "note"} <= set(data["knobs"][0])
    assert main(["plan", "engine", "--model-config", str(qwen36), *SEED]) == 0
    table = capsys.readouterr().out
    assert "1,086 tok/s per GPU" in table and "the measured rate is 37% of the ceiling" in table


@pytest.mark.parametrize("flags, names", [
    (["--gpus", "0"], "--gpus"),
    (["--gpus", "-4"], "--gpus"),
    (["--output-mean", "nan"], "--output-mean"),
    (["--prompt-mean", "-5"], "--prompt-mean"),
    (["--efficiency", "0"], "--efficiency"),
    (["--efficiency", "1.5"], "--efficiency"),
    (["--memory-utilization", "NaN"], "--memory-utilization"),
    (["--concurrency", "0"], "--concurrency"),
    (["--speculative", "mtp", "--draft-tokens", "3", "--acceptance", "4.5"], "--acceptance"),
    (["--speculative", "mtp"], "--acceptance"),
    (["--tp", "4", "--gpus", "4", "--tp", "5"], "--tp"),
    (["--tp", "3", "--gpus", "3"], "--tp 3 does not divide the 16 linear-attention key heads"),
    (["--gpu", "k80"], "rtx-pro-6000-server, rtx-pro-6000-workstation, h100, h200, b200, a100-80gb, l40s"),
    (["--per-gpu", "-400 tok/s"], "--per-gpu"),
])
def test_bad_input_is_one_line_naming_the_flag(qwen36, capsys, flags, names):
    assert main(["plan", "engine", "--model-config", str(qwen36), *SEED, *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert names in error and len(error.splitlines()) == 1 and "Traceback" not in error


def test_without_a_config_the_overrides_plan_alone(capsys):
    assert main(["plan", "engine", "--params", "27B", "--kv-bytes-per-token", "65536", "--state-bytes", "153.9M",
                 "--gpu", "h200", "--output-mean", "2500", "--prompt-mean", "200", "--concurrency", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["weights_bytes_per_step"] == 54e9 and data["batch"] == 64
    prefill = 64 * 200 / 2500  # prompt tokens per step, their KV and each new sequence's state written once
    expected = 64 / ((54e9 + 64 * 1450 * 65536 + 2 * 64 * 153.9e6 + prefill * 65536 + 64 / 2500 * 153.9e6) / 4800e9)
    assert math.isclose(data["ceiling_tokens_per_s_per_gpu"], expected, rel_tol=1e-12)


def test_custom_gpu_figures(qwen36, capsys):
    assert main(["plan", "engine", "--model-config", str(qwen36), "--gpu-bandwidth", "8 TB/s", "--gpu-memory", "288GB",
                 "--gpu-tflops", "2500", "--output-mean", "2500", "--prompt-mean", "200", "--concurrency", "48", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    prefill_bytes = 48 * 200 / 2500 * 65536 + 48 / 2500 * 153944064
    assert data["step_time_bandwidth_s"] == pytest.approx(
        (51.2492e9 + 48 * 1450 * 65536 + 2 * 48 * 153944064 + prefill_bytes) / 8e12, rel=1e-5)
    assert main(["plan", "engine", "--model-config", str(qwen36), "--gpu-bandwidth", "8 TB/s", "--output-mean", "9"]) == 2
    assert "--gpu-memory" in capsys.readouterr().err


def test_engine_settings_are_the_config_fields():
    from draftsmith.plan.engine import ENGINE_SETTINGS

    assert set(ENGINE_SETTINGS) == set(EnginePlanConfig.model_fields)


def test_the_main_plan_prints_the_ceiling_and_the_share(qwen36, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    argv = ["plan", "--samples", "914k", "--output-mean", "2500", "--prompt-mean", "200", "--per-gpu", "400 tok/s",
            "--gpus", "4", "--model-config", str(qwen36), "--gpu", "rtx-pro-6000-server", "--concurrency", "48"]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert round(data["wall_time"]["days"], 1) == 16.5
    assert round(data["ceiling"]["ceiling_tokens_per_s_per_gpu"]) == 1086 and data["ceiling"]["batch"] == 48
    assert data["ceiling"]["measured_share"] == pytest.approx(400 / data["ceiling"]["ceiling_tokens_per_s_per_gpu"])
    assert main(argv) == 0
    assert "the measured rate is 37% of the ceiling" in capsys.readouterr().out


def test_the_main_plan_says_how_a_short_bench_misleads_a_long_job(qwen36, tmp_path, capsys):
    bench = {"kind": "draftsmith.bench", "version": 1, "max_tokens": 1024,
             "results": [{"concurrency": 48, "output_tokens_per_s": 500.0, "mean_output_tokens": 1024}],
             "knee": {"concurrency": 48, "output_tokens_per_s": 500.0}}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    argv = ["plan", "--samples", "914k", "--output-mean", "2500", "--prompt-mean", "200", "--bench",
            str(tmp_path / "bench.json"), "--gpus", "4", "--model-config", str(qwen36), "--gpu", "rtx-pro-6000-server",
            "--engine", "sglang", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    context = data["ceiling"]["bench_context"]
    assert context["max_batch_at_job"] < context["max_batch_at_bench"]
    assert any("the batch that fits from" in warning for warning in data["warnings"])


def test_sliding_window_layers_keep_only_their_window(tmp_path):
    import transformers

    from draftsmith.plan.engine import build_setup, evaluate

    transformers.Gemma3TextConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=12, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=64, vocab_size=1000, sliding_window=128).save_pretrained(tmp_path)
    setup, _ = build_setup(EnginePlanConfig(model_config_path=str(tmp_path), gpu="h100", prompt_mean="1000",
                                            output_mean="2000"))
    roofline = evaluate(setup, 8)
    per_layer = 2 * 2 * 64 * 2  # K and V, 2 KV heads x 64, bf16
    assert roofline.kv_bytes_per_token == 2 * per_layer  # the 2 full-attention layers of 12
    context = 1000 + 2000 / 2
    kv = 8 * (context * 2 * per_layer + 128 * 10 * per_layer)  # 10 sliding layers keep 128 tokens
    kv += 8 * 1000 / 2000 * 12 * per_layer  # the prompts prefilled in the step write KV in all 12 layers
    assert roofline.bytes_per_step == pytest.approx(roofline.weights_bytes_per_step + kv, rel=1e-12)


def test_an_unreadable_config_exits_2_naming_field_and_override(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 4}))
    assert main(["plan", "engine", "--model-config", str(tmp_path), "--gpu", "h100", "--output-mean", "100"]) == 2
    error = capsys.readouterr().err.strip()
    assert "missing hidden_size" in error and "--params" in error and len(error.splitlines()) == 1


def test_prefill_of_long_prompts_moves_the_ceiling_by_hand_arithmetic(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    # 27B dense (bf16, 54 GB read per step), 64 KiB of KV per token, H200 (4.8 TB/s, 989 TFLOP/s), batch 256,
    # 1,024-token prompts and 512-token outputs (the published B200/GB300 runs' shape).
    argv = ["plan", "engine", "--params", "27B", "--kv-bytes-per-token", "65536", "--gpu", "h200", "--prompt-mean", "1024",
            "--output-mean", "512", "--concurrency", "256", "--samples", "1M", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    context = 1024 + 512 / 2
    prefill = 256 * 1024 / 512  # 256/512 sequences end per step, as many start, 1,024 prompt tokens each
    decode_bytes = 54e9 + 256 * context * 65536
    step_bytes = decode_bytes + prefill * 65536  # the prompts' KV is written once
    decode_flops = 256 * 2 * 27e9
    step_flops = decode_flops + prefill * 2 * 27e9
    step = max(step_bytes / 4.8e12, step_flops / 989e12)
    assert data["prefill_tokens_per_step"] == prefill == 512
    assert data["bound"] == "compute" and data["step_time_s"] == pytest.approx(step_flops / 989e12, rel=1e-12)
    decode_only = max(decode_bytes / 4.8e12, decode_flops / 989e12)  # 15.7 ms, bandwidth-bound without the prompts
    assert data["prefill_share"] == pytest.approx((step - decode_only) / step, rel=1e-12)
    assert round(data["prefill_share"], 2) == 0.63
    assert data["ceiling_tokens_per_s_per_gpu"] == pytest.approx(256 / step, rel=1e-12)
    assert round(256 / decode_only / (256 / step), 2) == 2.67  # decode alone would claim 2.67x this ceiling
    assert data["days_at_ceiling"] == pytest.approx(1e6 * 512 / (256 / step) / 86400, rel=1e-12)
    assert main(argv[:-1]) == 0
    table = capsys.readouterr().out
    assert f"512.0 prompt tokens per step (chunked with decode): {data['prefill_share']:.1%} of the step time" in table
    assert "prefill" in table.split("Knobs")[1]  # and a prefill column beside each knob


def test_the_seed_case_barely_moves_with_its_200_token_prompts(qwen36):
    plan = plan_of(qwen36)
    assert plan.prefill_tokens_per_step == pytest.approx(48 * 200 / 2500)
    assert 0 < plan.prefill_share < 0.001
    assert round(plan.ceiling_tokens_per_s_per_gpu) == 1086


def test_step_time_is_the_function_other_plans_build_on(qwen36):
    from draftsmith.plan.architecture import read_architecture
    from draftsmith.plan.engine import step_time
    from draftsmith.plan.gpus import find_gpu

    arch, gpu = read_architecture(qwen36), find_gpu("h100")
    one = step_time(arch, gpu, batch=1, tokens_per_seq=1, context=1000)
    assert one.bound == "bandwidth" and one.seconds == one.bandwidth_s
    verify = step_time(arch, gpu, batch=1, tokens_per_seq=8, context=1000)
    assert verify.seconds == pytest.approx(one.seconds, rel=1e-3)  # 8 tokens cost what 1 does at batch 1
    big = step_time(arch, gpu, batch=512, tokens_per_seq=8, context=1000)
    assert big.bound == "compute" and big.compute_s == pytest.approx(big.flops / 989e12)


def test_deepseek_v3_plans_with_its_latent_cache(tmp_path, capsys):
    from tests.plan.test_plan_architecture import write_deepseek_v3

    model = write_deepseek_v3(tmp_path)
    assert main(["plan", "engine", "--model-config", str(model), "--gpu", "h200", "--gpus", "8", "--tp", "8", "--weights",
                 "fp8", "--prompt-mean", "1024", "--output-mean", "1024", "--concurrency", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_bytes_per_token"] == 70_272 and data["state_bytes_per_sequence"] == 0
    assert not data["warnings"]
    assert main(["plan", "engine", "--model-config", str(model), "--gpu", "h200", "--gpus", "8", "--tp", "8", "--weights",
                 "fp8", "--prompt-mean", "1024", "--output-mean", "1024", "--concurrency", "64",
                 "--speculative", "mtp", "--draft-tokens", "1", "--acceptance", "1.8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ceiling_tokens_per_s_per_gpu"] > data["ceiling_tokens_per_s_per_gpu"]


@pytest.mark.parametrize("change, names", [
    ({"decoder_sparse_step": "2"}, "config.json: decoder_sparse_step must be a positive integer, got '2'"),
    ({"decoder_sparse_step": {"every": 2}}, "config.json: decoder_sparse_step"),
    ({"mlp_only_layers": 3}, "config.json: mlp_only_layers must be a list of layer indices, got 3"),
    ({"mlp_only_layers": ["a"]}, "config.json: mlp_only_layers must be a list of layer indices"),
    ({"num_hidden_layers": 10**9}, "config.json: num_hidden_layers 1,000,000,000 is beyond any real model's"),
    ({"sliding_window": -1, "model_type": "mistral"}, "config.json: sliding_window must be a whole number >= 0, got -1"),
    ({"head_dim": 0}, "config.json: head_dim must be a positive integer, got 0"),
])
def test_a_config_it_cannot_model_is_one_line_naming_the_config_field(qwen36, capsys, change, names):
    config = json.loads((qwen36 / "config.json").read_text())
    config["text_config"].update(change)
    (qwen36 / "config.json").write_text(json.dumps(config))
    assert main(["plan", "engine", "--model-config", str(qwen36), *SEED]) == 2
    error = capsys.readouterr().err.strip()
    assert names in error and len(error.splitlines()) == 1 and "Traceback" not in error
    assert " --rows" not in error and " --sliding-window" not in error


@pytest.mark.parametrize("flags, names", [
    (["--output-mean", "1e160"], "--output-mean '1e160' is longer than any model's context"),
    (["--prompt-mean", "1e160"], "--prompt-mean '1e160' is longer than any model's context"),
    (["--max-tokens", "1e30"], "--max-tokens"),
])
def test_lengths_beyond_any_context_are_one_line(qwen36, capsys, flags, names):
    assert main(["plan", "engine", "--model-config", str(qwen36), *SEED, *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert names in error and len(error.splitlines()) == 1


def test_mla_moe_active_parameters_match_the_published_figures(tmp_path):
    from draftsmith.plan.architecture import read_architecture
    from draftsmith.plan.engine import _active_params
    from tests.plan.test_plan_architecture import write_deepseek_v3

    arch = read_architecture(write_deepseek_v3(tmp_path))
    # Per token: everything but 248 of 256 routed experts; the embedding is a gather, not counted.
    routed_skipped = 58 * 248 * 3 * 7168 * 2048
    assert _active_params(arch, False) == arch.params() - 129280 * 7168 - routed_skipped
    assert round(_active_params(arch, False) / 1e9) == 37  # DeepSeek: "37B activated for each token"
