"""`draftsmith bench` against a real `draftsmith serve` process, and knee detection."""

from __future__ import annotations

import json

import pytest

from draftsmith.bench import BenchConfig, LevelResult, find_knee, load_bench, percentile, run_bench
from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.serve.process import ServeProcess
from draftsmith.tiny import synthetic_prompts


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(40, seed=9)))
    return path


def level(concurrency, tokens_per_s):
    return LevelResult(concurrency, tokens_per_s, 1.0, 1.0, 2.0, None, 100.0, 10)


def test_find_knee_is_the_first_level_near_the_plateau():
    curve = [level(1, 400), level(8, 2600), level(16, 3700), level(32, 3900), level(48, 4000), level(64, 3950)]
    assert find_knee(curve) == {"concurrency": 16, "output_tokens_per_s": 3700}
    assert find_knee(curve, tolerance=0.0)["concurrency"] == 48
    assert find_knee([level(4, 10)])["concurrency"] == 4


def test_percentile():
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(101)), 99) == pytest.approx(99)


def test_sweep_against_a_server_with_fixed_latency(prompts, tmp_path):
    with ServeProcess(["--delay", "0.05", "--served-model-name", "target"]) as server:
        result = run_bench(BenchConfig(endpoint=server.url, prompts=prompts, concurrencies=(1, 8), min_requests=16,
                                       max_tokens=64))
    data = result.to_dict()
    assert data["kind"] == "draftsmith.bench" and data["version"] == 1
    assert data["engine"] == "draftsmith" and data["model"] == "target" and data["max_tokens"] == 64
    one, eight = data["results"]
    assert set(one) == {"concurrency", "output_tokens_per_s", "requests_per_s", "latency_p50_s", "latency_p99_s",
                        "ttft_p50_s", "mean_output_tokens", "requests", "engine_metrics"}
    assert one["engine_metrics"] is None and data["warnings"] == []  # draftsmith serve has no /metrics
    assert (one["concurrency"], eight["concurrency"]) == (1, 8)
    assert one["latency_p50_s"] >= 0.05 and one["ttft_p50_s"] is not None and one["ttft_p50_s"] <= one["latency_p50_s"]
    assert one["requests_per_s"] < 21  # one request at a time, 50 ms each
    assert eight["requests_per_s"] > 4 * one["requests_per_s"]  # the server overlaps requests
    assert one["mean_output_tokens"] > 5
    assert one["output_tokens_per_s"] == pytest.approx(one["requests_per_s"] * one["mean_output_tokens"], rel=0.02)
    assert data["knee"]["concurrency"] == 8
    saved = load_bench(result.save(tmp_path / "bench.json"))
    assert saved == json.loads(json.dumps(data))


def test_cli_writes_json_and_rejects_bad_levels(prompts, tmp_path, capsys):
    with ServeProcess() as server:
        code = main(["bench", str(prompts), "-e", server.url, "--concurrency", "1,4", "--requests", "8",
                     "--no-stream", "-o", str(tmp_path / "b.json")])
    assert code == 0
    data = load_bench(tmp_path / "b.json")
    assert [r["concurrency"] for r in data["results"]] == [1, 4] and data["results"][0]["ttft_p50_s"] is None
    assert main(["bench", str(prompts), "--concurrency", "0,x"]) == 2
    with pytest.raises(InputError):
        load_bench(prompts)
