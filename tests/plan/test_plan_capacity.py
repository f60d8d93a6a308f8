import json

import pytest

from draftsmith.core.errors import InputError
from draftsmith.plan import PlanInputs, RateMismatchError, cluster_tokens_per_s, gpus_needed, make_plan

STORY = dict(samples=914_000, output_mean=2_500)


def test_known_case_16_5_days_at_1600():
    plan = make_plan(PlanInputs(**STORY, throughput="1,600 tok/s"))
    assert plan.total_output_tokens == 2_285_000_000
    assert plan.wall_time.seconds == pytest.approx(2_285_000_000 / 1600)  # 1,428,125 s
    assert plan.wall_time.days == pytest.approx(16.53, abs=0.01)
    assert plan.throughput.tokens_per_hour == pytest.approx(5.76e6)
    assert plan.throughput.tokens_per_day == pytest.approx(138.24e6)


def test_known_case_17_6_days_at_1500():
    plan = make_plan(PlanInputs(**STORY, throughput="1,500 tok/s"))
    assert plan.wall_time.days == pytest.approx(17.63, abs=0.01)
    assert plan.wall_time.hours == pytest.approx(2_285_000_000 / 1500 / 3600)


def test_per_gpu_times_gpus_is_the_same_story():
    plan = make_plan(PlanInputs(**STORY, per_gpu="400 tok/s", gpus=4))
    assert plan.throughput.tokens_per_s == 1600
    assert plan.throughput.per_gpu_tokens_per_s == 400
    assert plan.wall_time.days == pytest.approx(16.53, abs=0.01)


def test_unit_slip_1500_vs_5_4m_per_day_is_refused():
    with pytest.raises(RateMismatchError) as caught:
        make_plan(PlanInputs(**STORY, throughput="1,500 tok/s", claimed_rates=["5.4M/day"]))
    assert "5.4M/hour matches 1,500 tok/s" in str(caught.value)


def test_unit_slip_accepted_explicitly_plans_and_warns():
    plan = make_plan(PlanInputs(**STORY, throughput="1,500 tok/s", claimed_rates=["5.4M/day"], use_rate="throughput"))
    assert plan.wall_time.days == pytest.approx(17.63, abs=0.01)
    assert not plan.rate_checks[0].agrees
    assert any("5.4M/hour matches" in warning for warning in plan.warnings)
    on_claimed = make_plan(
        PlanInputs(**STORY, throughput="1,500 tok/s", claimed_rates=["5.4M/day"], use_rate="claimed")
    )
    assert on_claimed.wall_time.days == pytest.approx(2_285_000_000 / 62.5 / 86400)  # 423 days


def test_a_consistent_claimed_rate_passes():
    plan = make_plan(PlanInputs(**STORY, throughput="1,500 tok/s", claimed_rates=["5.4M/hour", "129.6M/day"]))
    assert all(check.agrees for check in plan.rate_checks)
    assert plan.warnings == []


def test_a_claimed_rate_alone_can_be_the_throughput():
    plan = make_plan(PlanInputs(**STORY, claimed_rates=["5.4M/hour"]))
    assert plan.throughput.tokens_per_s == pytest.approx(1500)


def test_gpu_scaling_with_efficiency():
    assert cluster_tokens_per_s(400, 1, 0.9) == 400
    assert cluster_tokens_per_s(400, 4, 0.9) == pytest.approx(1440)
    plan = make_plan(PlanInputs(**STORY, per_gpu="400 tok/s", gpus=4, efficiency=0.9))
    assert plan.throughput.tokens_per_s == pytest.approx(1440)
    rows = {row.gpus: row for row in plan.gpu_scaling}
    assert rows[1].tokens_per_s == 400
    assert rows[8].tokens_per_s == pytest.approx(2880)
    assert rows[8].days == pytest.approx(2_285_000_000 / 2880 / 86400)
    # A total rate with a GPU count gives back the per-GPU rate: 1,440 / (4 * 0.9) = 400.
    total = make_plan(PlanInputs(**STORY, throughput="1,440 tok/s", gpus=4, efficiency=0.9))
    assert total.throughput.per_gpu_tokens_per_s == pytest.approx(400)


def test_deadline_gives_gpus_needed():
    # 2.285e9 tokens in 7 days needs 3,778 tok/s; at 400/GPU x 0.9 that is ceil(10.49) = 11 GPUs.
    plan = make_plan(PlanInputs(**STORY, per_gpu="400 tok/s", gpus=4, efficiency=0.9, deadline="7d"))
    deadline = plan.deadline
    assert deadline.required_tokens_per_s == pytest.approx(2_285_000_000 / (7 * 86400))
    assert deadline.gpus_needed == 11
    assert cluster_tokens_per_s(400, 10, 0.9) < deadline.required_tokens_per_s <= cluster_tokens_per_s(400, 11, 0.9)
    assert not deadline.meets_deadline and deadline.slack_s < 0
    assert deadline.wall_time_with_gpus_needed.days <= 7
    rows = {row.gpus: row for row in plan.gpu_scaling}
    assert 11 in rows and rows[11].meets_deadline and not rows[8].meets_deadline
    # 36 days needs 735 tok/s: 2 GPUs (800 tok/s, 33.1 days) are enough, and 4 finish with time to spare.
    relaxed = make_plan(PlanInputs(**STORY, per_gpu="400 tok/s", gpus=4, deadline="36d"))
    assert relaxed.deadline.meets_deadline and relaxed.deadline.gpus_needed == 2
    assert relaxed.deadline.wall_time_with_gpus_needed.days == pytest.approx(33.06, abs=0.01)


def test_deadline_without_gpu_information_still_gives_the_rate():
    plan = make_plan(PlanInputs(**STORY, throughput="1,600 tok/s", deadline="36h"))
    assert plan.deadline.gpus_needed is None
    assert plan.deadline.required_tokens_per_s == pytest.approx(2_285_000_000 / (36 * 3600))
    assert plan.gpu_scaling == []


def test_gpus_needed_edges():
    assert gpus_needed(300, 400, 0.9) == 1
    assert gpus_needed(400, 400, 0.5) == 1
    assert gpus_needed(401, 400, 0.5) == 3  # 2 GPUs at 0.5 give exactly 400


def test_sensitivity_table_by_hand():
    plan = make_plan(PlanInputs(**STORY, throughput="1,600 tok/s", sensitivity_factors=[0.5, 1, 2]))
    table = plan.sensitivity
    assert table.tokens_per_s == [800, 1600, 3200]
    assert table.output_means == [1250, 2500, 5000]
    assert table.days[1][1] == pytest.approx(plan.wall_time.days)
    assert table.days[0][2] == pytest.approx(914_000 * 5000 / 800 / 86400)  # half the speed, twice the length
    capped = make_plan(PlanInputs(**STORY, throughput="1,600 tok/s", max_tokens=4096, sensitivity_factors=[1, 2]))
    assert capped.sensitivity.output_means == [2500, 4096]


def test_distribution_drives_the_mean_and_tail(tmp_path):
    lengths = [1000] * 90 + [10_000] * 10
    plan = make_plan(PlanInputs(samples=1000, output_lengths=lengths, max_tokens=8192, throughput="100 tok/s"))
    assert plan.output_mean == pytest.approx((90 * 1000 + 10 * 8192) / 100)
    assert plan.total_output_tokens == round(1000 * plan.output_mean)
    assert plan.output_distribution.share_at_cap == pytest.approx(0.1)
    assert plan.output_distribution.tail_token_share == pytest.approx(81_920 / 171_920)
    assert any("hit max_tokens=8192" in warning for warning in plan.warnings)


def test_storage_in_the_plan_counts_prompt_and_output(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 5120, "num_hidden_layers": 64}))
    plan = make_plan(
        PlanInputs(**STORY, prompt_mean=500, throughput="1,600 tok/s", model_config_path=str(config), disk="90TB")
    )
    assert plan.storage.total_tokens == 914_000 * 3_000
    assert plan.storage.total_bytes == 140_390_400_000_000
    assert plan.storage.disk_bytes == 90 * 10**12
    assert plan.storage.recommendation == "online"
    no_prompt = make_plan(PlanInputs(**STORY, throughput="1,600 tok/s", hidden_size=5120))
    assert no_prompt.storage.total_tokens == 2_285_000_000
    assert any("completion tokens only" in warning for warning in no_prompt.warnings)
    with pytest.raises(InputError, match="more than the model's 64 layers"):
        make_plan(PlanInputs(**STORY, throughput="1 tok/s", model_config_path=str(config), captured_layers=65))


def test_bench_result_is_per_gpu(tmp_path):
    bench = {
        "kind": "draftsmith.bench", "version": 1, "engine": "sglang", "model": "target", "endpoint": "http://x",
        "max_tokens": 4096,
        "results": [
            {"concurrency": 48, "output_tokens_per_s": 400.0, "requests_per_s": 0.2, "latency_p50_s": 10,
             "latency_p99_s": 20, "ttft_p50_s": None, "mean_output_tokens": 2400.0, "requests": 96},
        ],
        "knee": {"concurrency": 48, "output_tokens_per_s": 400.0},
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    plan = make_plan(PlanInputs(**STORY, bench=str(path), gpus=4))
    assert plan.throughput.source == "bench"
    assert plan.throughput.tokens_per_s == 1600
    assert plan.wall_time.days == pytest.approx(16.53, abs=0.01)
    assert plan.warnings == []
    # A bench at much shorter outputs than planned is flagged.
    bench["results"][0]["mean_output_tokens"] = 600.0
    path.write_text(json.dumps(bench))
    assert any("bench knee was measured" in w for w in make_plan(PlanInputs(**STORY, bench=str(path))).warnings)
    bench["kind"] = "something"
    path.write_text(json.dumps(bench))
    with pytest.raises(InputError, match="field 'kind'"):
        PlanInputs(**STORY, bench=str(path))


@pytest.mark.parametrize(
    "changes, fragment",
    [
        (dict(samples=-5), "--samples"),
        (dict(samples=0), "positive whole number"),
        (dict(output_mean=-1), "--output-mean"),
        (dict(per_gpu="400 tok/fortnight"), "unknown time unit 'fortnight'"),
        (dict(efficiency=1.5), "--efficiency must be in"),
        (dict(deadline="7"), "needs a unit"),
        (dict(disk="90 XB"), "unknown size unit"),
        (dict(claimed_rates=["5.4M"]), "needs a time unit"),
    ],
)
def test_bad_inputs_raise_input_error(changes, fragment):
    values = dict(STORY, throughput="1,600 tok/s") | changes
    with pytest.raises(InputError, match=fragment):
        make_plan(values)


def test_missing_inputs():
    with pytest.raises(InputError, match="--samples is required"):
        make_plan({"output_mean": 5, "throughput": "1 tok/s"})
    with pytest.raises(InputError, match="missing output length"):
        make_plan({"samples": 5, "throughput": "1 tok/s"})
    with pytest.raises(InputError, match="no throughput given"):
        make_plan({"samples": 5, "output_mean": 5})
    with pytest.raises(InputError, match="not both"):
        make_plan({"samples": 5, "output_mean": 5, "output_lengths": [5], "throughput": "1 tok/s"})
    with pytest.raises(InputError, match="cannot exceed the cap"):
        make_plan({"samples": 5, "output_mean": 5000, "max_tokens": 4096, "throughput": "1 tok/s"})


def test_plan_dict_is_json_ready():
    plan = make_plan(PlanInputs(**STORY, throughput="1,600 tok/s", hidden_size=5120))
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["kind"] == "draftsmith.plan"
    assert data["wall_time"]["days"] == pytest.approx(16.53, abs=0.01)
    assert data["storage"]["recommendation"] == "online"
    assert data["inputs"]["throughput"] == "1,600 tok/s" and "output_lengths" not in data["inputs"]


def test_per_gpu_rates_are_scaled_and_refused_as_totals():
    plan = make_plan(PlanInputs(**STORY, per_gpu="400 tok/s/GPU", gpus=4, claimed_rates=["1.44M/hour per GPU"]))
    assert plan.throughput.tokens_per_s == 1600
    assert plan.rate_checks[0].agrees and plan.rate_checks[0].other_tokens_per_s == pytest.approx(1600)
    with pytest.raises(InputError, match="use --per-gpu"):
        PlanInputs(**STORY, throughput="400 tok/s/GPU")


def test_measured_lengths_suggest_a_max_tokens():
    censored = make_plan(PlanInputs(samples=100, output_lengths=[500] * 58 + [2048] * 42, max_tokens=2048,
                                    throughput="100 tok/s"))
    assert censored.suggested_max_tokens == 4096  # 42% hit the cap: their lengths are unknown, measure again
    assert "42% of measured answers hit max_tokens=2,048" in censored.suggested_max_tokens_reason
    fits = make_plan(PlanInputs(samples=100, output_lengths=list(range(100, 1100, 10)), max_tokens=8192,
                                throughput="100 tok/s"))
    assert fits.suggested_max_tokens == 1536 and "p99" in fits.suggested_max_tokens_reason  # 1080.1 * 1.25 -> 6 x 256
    assert make_plan(PlanInputs(**STORY, throughput="1 tok/s")).suggested_max_tokens is None  # no lengths measured


def test_columns_the_cap_makes_equal_are_shown_once():
    plan = make_plan(PlanInputs(**STORY, throughput="1,600 tok/s", max_tokens=2500, sensitivity_factors=[0.5, 1, 1.5, 2]))
    table = plan.sensitivity
    assert table.length_factors == [0.5, 1] and table.output_means == [1250, 2500]
    assert all(len(row) == 2 for row in table.days)
    at_cap = make_plan(PlanInputs(samples=1000, output_mean=1000, throughput="100 tok/s", max_tokens=1000,
                                  sensitivity_factors=[2, 1, 0.5]))
    assert at_cap.sensitivity.length_factors == [0.5, 1] and at_cap.sensitivity.output_means == [500, 1000]  # 2x is the cap again: the plan's own column is kept


def test_a_cap_hit_is_not_called_thinking_cut_off():
    lengths = [1000] * 90 + [10_000] * 10
    plan = make_plan(PlanInputs(samples=1000, output_lengths=lengths, max_tokens=8192, throughput="100 tok/s"))
    warning = next(warning for warning in plan.warnings if "hit max_tokens=8192" in warning)
    assert "thinking" not in warning and "cut off unfinished" in warning
