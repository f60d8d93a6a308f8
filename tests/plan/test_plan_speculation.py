"""`plan speculation`: tau per K from a per-position profile, the verify and draft step times rebuilt
by hand from the configs, the best K per concurrency, the profile read from every file that carries
one (eval, eval --endpoint, check, bench, a vLLM /metrics scrape), and bad input as one line (exit 2)."""

from __future__ import annotations

import json

import pytest

from draftsmith.bench.engine_metrics import read_snapshot, summarize
from draftsmith.bench.sweep import BenchResult, LevelResult
from draftsmith.check.config import CheckSummary
from draftsmith.cli import main
from draftsmith.evaluate.speculative import EvalReport
from draftsmith.plan.gpus import find_gpu
from draftsmith.plan.speculation import SpeculationPlanConfig, make_speculation_plan, read_profiles

H100 = find_gpu("h100")
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 1024, 4, 8, 4, 128, 3072, 32000
# One Qwen3 layer by hand: q, k, v, o; gate/up/down; q/k norms; two layer norms.
LAYER = (HIDDEN * HEADS * HEAD_DIM + 2 * HIDDEN * KV_HEADS * HEAD_DIM + HEADS * HEAD_DIM * HIDDEN
         + 3 * INTER * HIDDEN + 2 * HEAD_DIM + 2 * HIDDEN)
FEATURES = 2  # target layers the drafter reads
PROFILE = [0.8, 0.6, 0.45, 0.3, 0.2, 0.1, 0.05]


def qwen3(**extra) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM, "intermediate_size": INTER, "vocab_size": VOCAB, "tie_word_embeddings": False, **extra}


@pytest.fixture
def models(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(qwen3()))
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    # What `draftsmith export` writes for a 1-layer, block-8 DFlash drafter of this target.
    (drafter / "config.json").write_text(json.dumps(qwen3(
        architectures=["DFlashDraftModel"], num_hidden_layers=1, block_size=8, num_target_layers=LAYERS,
        dflash_config={"mask_token_id": 3, "target_layer_ids": [1, 2]}, layer_types=["full_attention"])))
    return target, drafter


def plan_of(models, **values):
    target, drafter = models
    settings = dict(model_config_path=str(target), drafter=str(drafter), gpu="h100", output_mean="1000",
                    prompt_mean="200", acceptance=",".join(map(str, PROFILE)))
    settings.update(values)
    return make_speculation_plan(SpeculationPlanConfig(**{k: v for k, v in settings.items() if v is not None}))


def test_tau_and_step_times_by_hand(models):
    plan = plan_of(models, concurrency="1,8", engine="ideal")
    context = 200 + 1000 / 2
    kv_per_token = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2  # bytes, bf16
    weights = (LAYERS * LAYER + HIDDEN + VOCAB * HIDDEN) * 2  # layers, final norm, LM head; no embedding
    for entry in plan.plans:
        batch = entry.concurrency
        assert entry.batch == batch
        # No speculation: bandwidth-bound at these batches on an H100.
        plain_bytes = weights + batch * context * kv_per_token
        assert entry.no_speculation.target_bound == "bandwidth"
        assert entry.no_speculation.target_step_s == pytest.approx(plain_bytes / 3350e9, rel=1e-9)
        assert entry.no_speculation.tokens_per_s == pytest.approx(batch / entry.no_speculation.step_time_s)
        assert [option.draft_tokens for option in entry.drafter] == list(range(1, 8))
        for option in entry.drafter:
            k = option.draft_tokens
            tau = 1 + sum(PROFILE[:k])
            assert option.tau == pytest.approx(tau)
            # The target verifies K+1 tokens per request: same bytes (weights are read once), more FLOPs.
            assert option.target_step_s == pytest.approx(plain_bytes / 3350e9, rel=1e-9)
            # The drafter: its layer, fc over 2 target layers and the target's LM head read once; its KV over
            # the context; the tau new tokens' target features.
            layer_kv = 2 * KV_HEADS * HEAD_DIM
            draft_bytes = ((LAYER + FEATURES * HIDDEN * HIDDEN + VOCAB * HIDDEN) * 2 + batch * context * layer_kv * 2
                           + batch * tau * FEATURES * HIDDEN * 2)
            draft_flops = (batch * (k + 1) * (2 * LAYER + 4 * HEADS * HEAD_DIM * (context + k + 1))
                           + batch * tau * 2 * (FEATURES * HIDDEN * HIDDEN + 2 * KV_HEADS * HEAD_DIM * HIDDEN)
                           + batch * k * 2 * VOCAB * HIDDEN)
            assert option.drafter_step_s == pytest.approx(max(draft_bytes / 3350e9, draft_flops / 989e12), rel=1e-9)
            assert option.step_time_s == pytest.approx(option.target_step_s + option.drafter_step_s)
            assert option.tokens_per_s == pytest.approx(batch * tau / option.step_time_s)
        best = max(entry.drafter, key=lambda option: option.tokens_per_s)
        assert entry.best_k == best.draft_tokens and entry.best_tokens_per_s == best.tokens_per_s


def test_best_k_shrinks_as_the_batch_makes_verification_compute_bound(models):
    # Short contexts: the KV read stays small, so the batch turns the verify compute-bound.
    plan = plan_of(models, concurrency="1,512", engine="ideal", acceptance="0.9,0.8,0.7,0.6,0.5,0.4,0.3",
                   output_mean="100", prompt_mean="0")
    small, large = plan.plans
    assert small.no_speculation.target_bound == "bandwidth"
    # At batch 1 every extra draft is nearly free: the longest block wins.
    assert small.best_k == 7 and small.best_speedup > 2
    # At batch 512 a verify of 512 x (K+1) tokens is compute-bound: extra drafts cost their FLOPs.
    assert any(option.target_bound == "compute" for option in large.drafter)
    assert large.best_k < small.best_k
    assert large.best_speedup < small.best_speedup


def test_step_overhead_is_paid_by_every_step(models):
    plan = plan_of(models, concurrency="1", step_overhead="2ms")
    entry = plan.plans[0]
    assert plan.step_overhead_s == pytest.approx(0.002)
    assert entry.no_speculation.step_time_s == pytest.approx(entry.no_speculation.target_step_s + 0.002)
    # Overhead-bound, speculation gains about tau: each step costs about the same.
    best = entry.drafter[-1]
    assert best.speedup == pytest.approx(best.tau, rel=0.1)


def test_a_speculative_step_pays_the_device_entrys_draft_overheads(models, tmp_path):
    from draftsmith.plan.gpus import device_dict

    device = H100.model_copy(update={"name": "h100-engine", "step_overhead_s": 0.001, "request_overhead_s": 0.0002,
                                     "draft_step_overhead_s": 0.002, "draft_request_overhead_s": 0.0005,
                                     "draft_token_overhead_s": 0.0001})
    path = tmp_path / "device.json"
    path.write_text(json.dumps(device_dict(device)))
    plan = plan_of(models, gpu=str(path), concurrency="1,8", ngram_acceptance="0.5,0.2")
    for entry in plan.plans:
        assert entry.ngram
        assert entry.no_speculation.overhead_s == pytest.approx(0.001 + entry.batch * 0.0002)
        # Drafter and n-gram alike pay the speculative machinery (proposer, rejection sampler) on top;
        # only the drafter pays its forward's cost per drafted token.
        for option in [*entry.drafter, *entry.ngram]:
            per_token = entry.batch * option.draft_tokens * 0.0001 if option in entry.drafter else 0.0
            assert option.overhead_s == pytest.approx(0.001 + entry.batch * 0.0002 + 0.002 + entry.batch * 0.0005
                                                      + per_token)
            assert option.step_time_s == pytest.approx(option.target_step_s + option.drafter_step_s + option.overhead_s)


def test_ngram_from_the_eval_report_beside_the_drafter(models, tmp_path):
    def report(method, profile, baselines=()):
        return EvalReport(tau=1 + sum(profile), acceptance_histogram={}, block_size=8, num_prompts=4,
                          total_new_tokens=400, total_cycles=200, speculative_tokens_per_s=1.0, target_tokens_per_s=1.0,
                          speedup=1.0, lossless=True, mismatched_prompts=[], max_new_tokens=100, per_prompt=[],
                          per_position_acceptance=profile, method=method, baselines=list(baselines))

    path = tmp_path / "eval.json"
    path.write_text(report("dflash", PROFILE, [report("ngram", [0.5, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15])]).to_json())
    plan = plan_of(models, acceptance=None, acceptance_from=str(path), concurrency="1,64")
    assert plan.acceptance.per_position == PROFILE
    assert plan.ngram_acceptance.per_position[0] == 0.5
    for entry in plan.plans:
        assert [option.draft_tokens for option in entry.ngram] == list(range(1, 8))
        ngram = entry.ngram[0]
        assert ngram.drafter_step_s == 0 and ngram.tau == pytest.approx(1.5)
        assert entry.ngram_best_k == max(entry.ngram, key=lambda option: option.tokens_per_s).draft_tokens


def _vllm_scrape(drafts, counts):
    lines = [f'vllm:num_requests_running{{engine="0",model_name="tiny"}} 1',
             f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="tiny"}} {drafts}']
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny",position="{k}"}} {c}'
              for k, c in enumerate(counts)]
    return "\n".join(lines) + "\n"


def test_profiles_from_every_file_that_carries_one(tmp_path):
    counts = [160, 120, 90, 60, 40, 20, 10]
    expected = [count / 200 for count in counts]
    scrape = tmp_path / "metrics.txt"
    scrape.write_text("# HELP vllm:spec_decode_num_drafts_total drafts\n" + _vllm_scrape(200, counts))
    assert read_profiles(scrape, "--acceptance-from")["drafter"].per_position == pytest.approx(expected)

    # bench: two levels' deltas, summed.
    level_metrics = []
    for before, after in (((0, [0] * 7), (120, [c * 120 // 200 for c in counts])),
                          ((120, [c * 120 // 200 for c in counts]), (200, counts))):
        level_metrics.append(summarize([read_snapshot(_vllm_scrape(*before)), read_snapshot(_vllm_scrape(*after))], 1))
    levels = [LevelResult(concurrency=c, output_tokens_per_s=10.0, requests_per_s=1.0, latency_p50_s=1.0,
                          latency_p99_s=1.0, ttft_p50_s=None, mean_output_tokens=10.0, requests=4, engine_metrics=metrics)
              for c, metrics in zip((1, 8), level_metrics)]
    bench = tmp_path / "bench.json"
    BenchResult(engine="vllm", model="tiny", endpoint="http://127.0.0.1:1", max_tokens=64, results=levels,
                knee={"concurrency": 8, "output_tokens_per_s": 10.0}).save(bench)
    from_bench = read_profiles(bench, "--acceptance-from")["drafter"]
    assert from_bench.per_position == pytest.approx(expected) and from_bench.steps == 200

    # check --overfit --endpoint: [steps, accepted at position 1, ...] per held-out prompt.
    check = tmp_path / "check.json"
    summary = CheckSummary(export="e", target="t", overfit={"engine_acceptance": {"a": [120, *[c * 120 // 200 for c in counts]],
                                                                                   "b": [80, *[c * 80 // 200 for c in counts]]}})
    check.write_text(summary.to_json())
    assert read_profiles(check, "--acceptance-from")["drafter"].per_position == pytest.approx(expected)

    endpoint = tmp_path / "endpoint.json"
    endpoint.write_text(json.dumps({"kind": "draftsmith.eval.endpoint", "version": 1, "num_drafts": 200,
                                    "per_position_acceptance": expected}))
    assert read_profiles(endpoint, "--acceptance-from")["drafter"].per_position == pytest.approx(expected)


def test_cli_json_is_strict_and_matches_the_api(models, capsys):
    target, drafter = models
    argv = ["plan", "speculation", "--model-config", str(target), "--drafter", str(drafter), "--gpu", "h100",
            "--acceptance", "0.8,0.6,0.4", "--output-mean", "1000", "--concurrency", "1,32", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "draftsmith.plan.speculation" and data["version"] == 1
    assert [entry["concurrency"] for entry in data["plans"]] == [1, 32]
    assert [option["draft_tokens"] for option in data["plans"][0]["drafter"]] == [1, 2, 3]
    assert any("measured 3 draft positions" in warning for warning in data["warnings"])
    assert main(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "best K per concurrency" in out and "concurrency 32" in out


@pytest.mark.parametrize("change, message", [
    ({"--acceptance": "0.8,1.2"}, "--acceptance: position 2: acceptance 1.2 is outside [0, 1]"),
    ({"--acceptance": "0.5,0.7"}, "--acceptance: position 2: acceptance 0.7 is above position 1's 0.5"),
    ({"--acceptance": ","}, "--acceptance: the acceptance profile is empty"),
    ({"--draft-tokens": "9"}, "--draft-tokens 9 is beyond the drafter's block: block_size 8 drafts at most 7"),
    ({"--draft-tokens": "5"}, "--draft-tokens 5: --acceptance measured only 3 draft positions"),
    ({"--gpu": "DEVICE"}, "not a device file (field 'kind' is 'draftsmith.bench'"),
    ({"--gpu": "MISSING"}, "no such device file"),
    ({"--acceptance-from": "EMPTY_BENCH", "--acceptance": None}, "no level of this bench recorded per-position"),
    ({"--acceptance-from": "SCRAPE", "--acceptance": None}, "no verify steps counted"),
])
def test_bad_input_exits_2_with_one_line(models, tmp_path, capsys, change, message):
    target, drafter = models
    (tmp_path / "not-a-device.json").write_text(json.dumps({"kind": "draftsmith.bench", "version": 1}))
    (tmp_path / "empty-bench.json").write_text(json.dumps({"kind": "draftsmith.bench", "version": 1, "results": [
        {"concurrency": 1, "engine_metrics": {"spec_acceptance": None}}]}))
    (tmp_path / "scrape.txt").write_text(_vllm_scrape(0, []))
    files = {"DEVICE": tmp_path / "not-a-device.json", "MISSING": tmp_path / "none" / "device.json",
             "EMPTY_BENCH": tmp_path / "empty-bench.json", "SCRAPE": tmp_path / "scrape.txt"}
    flags = {"--model-config": str(target), "--drafter": str(drafter), "--gpu": "h100", "--acceptance": "0.8,0.6,0.4",
             "--output-mean": "100"}
    flags.update(change)
    argv = ["plan", "speculation"]
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, str(files.get(value, value))]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("\n") == 1
