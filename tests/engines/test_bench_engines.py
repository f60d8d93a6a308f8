"""`draftsmith bench` against real engines: a small concurrency sweep producing contract-3 JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import draftsmith
from draftsmith.tiny import synthetic_prompts

pytestmark = pytest.mark.timeout(400)

SRC = str(Path(draftsmith.__file__).resolve().parents[1])
LEVELS = (1, 4, 8)
REQUESTS_PER_LEVEL = 16
MAX_TOKENS = 128
# What `/v1/models` says owns the model, which bench reports as the engine.
ENGINE_NAME = {"vllm": "vllm", "llama-server": "llamacpp"}


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "blocking"])
def test_bench_sweeps_concurrency_and_writes_the_plan_json(engine, tmp_path, stream):
    # Streaming against llama-server also covers its closing the connection after every stream
    # despite "Keep-Alive: max=100": a request must not fail for landing on such a socket.
    prompts = tmp_path / "prompts.jsonl"
    with prompts.open("w") as handle:
        for row in synthetic_prompts(32, seed=3):
            handle.write(json.dumps(row) + "\n")
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])))
    argv = [
        sys.executable, "-m", "draftsmith", "bench", str(prompts), "--endpoint", engine.api_url,
        "--out", str(out), "--concurrency", ",".join(map(str, LEVELS)),
        "--requests", str(REQUESTS_PER_LEVEL), "--max-tokens", str(MAX_TOKENS), "--temperature", "0",
        "--stream" if stream else "--no-stream",
    ]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads(out.read_text())
    assert report["kind"] == "draftsmith.bench" and report["version"] == 1
    assert report["engine"] == ENGINE_NAME[engine.kind]
    assert report["model"] == engine.model_name
    assert str(engine.port) in report["endpoint"]
    assert report["max_tokens"] == MAX_TOKENS
    levels = report["results"]
    assert [level["concurrency"] for level in levels] == list(LEVELS)
    for level in levels:
        assert level["requests"] == REQUESTS_PER_LEVEL
        assert level["output_tokens_per_s"] > 0 and level["requests_per_s"] > 0
        assert 0 < level["latency_p50_s"] <= level["latency_p99_s"]
        # Real thinking completions of the tiny target: tens of tokens, under the cap.
        assert 10 < level["mean_output_tokens"] <= MAX_TOKENS
        if stream:
            assert level["ttft_p50_s"] is not None and 0 < level["ttft_p50_s"] <= level["latency_p50_s"]
        else:
            assert level["ttft_p50_s"] is None
    for level in levels:
        # vLLM serves /metrics: each level stores the running batch it saw; llama-server here serves none.
        metrics = level["engine_metrics"]
        if engine.kind == "vllm":
            assert metrics["engine"] == "vllm" and 0 <= metrics["running_max"] <= level["concurrency"]
        else:
            assert metrics is None
    knee = report["knee"]
    by_level = {level["concurrency"]: level for level in levels}
    assert knee["concurrency"] in by_level
    assert knee["output_tokens_per_s"] == pytest.approx(by_level[knee["concurrency"]]["output_tokens_per_s"])


def test_bench_records_the_running_batch_from_vllm_metrics(start_vllm, tiny_target_dir, tmp_path):
    # vLLM CPU capped at 2 running requests: the sweep sends 6 at once and must say that only 2 ran.
    server = start_vllm(tiny_target_dir, "max-num-seqs-2", extra_args=["--max-num-seqs", "2"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(24, seed=5)))
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])))
    argv = [sys.executable, "-m", "draftsmith", "bench", str(prompts), "--endpoint", server.api_url, "--out", str(out),
            "--concurrency", "1,6", "--requests", "16", "--max-tokens", "96", "--temperature", "0",
            # Every request runs its full 96 tokens (the tiny target may stop after a few): the capped
            # level then lasts long enough for the polls to see both slots busy and the queue.
            "--extra-body", '{"ignore_eos": true}', "--metrics-interval", "0.05"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    one, six = report["results"]
    for level in (one, six):
        metrics = level["engine_metrics"]
        assert metrics["engine"] == "vllm" and metrics["polls"] >= 2
        assert metrics["requested_concurrency"] == level["concurrency"]
        assert metrics["cache_usage_max"] is not None and 0 <= metrics["cache_usage_max"] <= 1
    print("engine_metrics:", one["engine_metrics"], six["engine_metrics"], report["warnings"])
    assert one["engine_metrics"]["running_max"] <= 1
    # The cap, never the 6 requests in flight; polls every 50 ms may miss the moments both slots are busy.
    assert 1 <= six["engine_metrics"]["running_max"] <= 2
    assert six["engine_metrics"]["waiting_max"] >= 1
    assert any(w.startswith("concurrency 6: the engine ran at most") for w in report["warnings"])
    assert "concurrency 6: the engine ran at most" in " ".join(result.stderr.split())
