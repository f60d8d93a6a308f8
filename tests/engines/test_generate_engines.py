"""`draftsmith generate` against real engines, including an engine killed in the middle of a run.

The CLI runs as a subprocess (as users run it), the engines are real servers, and the checks read
the output files directly rather than through the store's own reader.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import draftsmith
from draftsmith.tiny import synthetic_prompts

pytestmark = pytest.mark.timeout(600)

SRC = str(Path(draftsmith.__file__).resolve().parents[1])


def write_prompts(path: Path, count: int, seed: int = 7) -> list[str]:
    rows = list(synthetic_prompts(count, seed=seed))
    with path.open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return [row["id"] for row in rows]


def generate_argv(prompts: Path, output: Path, engine, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "draftsmith", "generate", str(prompts), "--output", str(output),
        "--endpoint", engine.api_url, "--temperature", "0", "--max-tokens", "256",
        "--no-progress", "--json", *extra,
    ]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    return env


def run_generate(prompts: Path, output: Path, engine, *extra: str, timeout: float = 300):
    result = subprocess.run(generate_argv(prompts, output, engine, *extra), env=cli_env(),
                            capture_output=True, text=True, timeout=timeout)
    return result, _summary(result.stdout)


def _summary(stdout: str) -> dict | None:
    start = stdout.find("{")
    return json.loads(stdout[start:]) if start >= 0 else None


def complete_rows(output: Path) -> list[dict]:
    """Every complete (newline-terminated) row in the output shards; a torn tail is not a row."""
    rows = []
    for part in sorted(output.glob("generated-*.jsonl")):
        text = part.read_text()
        lines = text.split("\n")[:-1]  # whatever follows the last newline is incomplete
        rows.extend(json.loads(line) for line in lines if line.strip())
    return rows


def assert_row_captures_the_completion(row: dict, engine, tokenizer) -> None:
    """One generated row holds the engine's whole thinking completion, split and accounted."""
    answer = row["messages"][-1]
    assert answer["role"] == "assistant"
    assert isinstance(answer["content"], str) and isinstance(answer["reasoning_content"], str)
    # The tiny target always reasons when thinking is on (its answers may be empty now and then).
    assert answer["reasoning_content"].strip(), row
    assert "think>" not in answer["content"] and "think>" not in answer["reasoning_content"]
    assert row["finish_reason"] == "stop"
    assert row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
    assert row["model"] == engine.model_name
    assert str(engine.port) in row["endpoint"]
    assert row["latency_s"] > 0
    if engine.kind == "vllm":
        assert 0 < row["reasoning_tokens"] < row["completion_tokens"]
        assert len(row["prompt_token_ids"]) == row["prompt_tokens"]
        assert len(row["completion_token_ids"]) == row["completion_tokens"]
        # The token ids are the very completion whose text was split into reasoning and answer.
        decoded = tokenizer.decode(row["completion_token_ids"], skip_special_tokens=False)
        # A sampled answer may end without closing its thinking: then the whole turn is reasoning.
        closed = "</think>" in decoded
        if not closed:
            assert answer["content"] == "", (decoded, answer)
        expected = f"<think>{answer['reasoning_content']}{'</think>' if closed else ''}{answer['content']}<|im_end|>"
        # generate trims the whitespace around each part; everything else must match.
        assert "".join(decoded.split()) == "".join(expected.split()), (decoded, expected)


def assert_mostly_answered(rows: list[dict]) -> None:
    answered = sum(1 for row in rows if row["messages"][-1]["content"].strip())
    assert answered >= 0.8 * len(rows), f"only {answered}/{len(rows)} rows have an answer"


def assert_exactly_once(rows: list[dict], ids: list[str]) -> None:
    counts = Counter(row["id"] for row in rows)
    duplicated = {sample_id: n for sample_id, n in counts.items() if n > 1}
    assert not duplicated, f"samples written more than once: {duplicated}"
    missing = set(ids) - set(counts)
    assert not missing, f"{len(missing)} samples missing, e.g. {sorted(missing)[:3]}"
    assert set(counts) == set(ids)


@pytest.mark.parametrize("stream", [False, True], ids=["blocking", "streaming"])
def test_generate_writes_a_complete_row_per_prompt(engine, tmp_path, stream, tiny_tokenizer):
    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, 24)
    output = tmp_path / "out"
    extra = ["--concurrency", "8"] + (["--stream"] if stream else [])
    result, summary = run_generate(prompts, output, engine, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary["input"] == 24 and summary["done"] == 24
    assert summary["failed"] == summary["remaining"] == 0
    rows = complete_rows(output)
    assert_exactly_once(rows, ids)
    for row in rows:
        assert_row_captures_the_completion(row, engine, tiny_tokenizer)
    assert_mostly_answered(rows)
    assert summary["output_tokens"] == sum(row["completion_tokens"] for row in rows)


def spawn_generate(argv: list[str], log_dir: Path) -> subprocess.Popen:
    """Start generate in the background; stderr goes to a file so a chatty run never blocks on a pipe."""
    stderr = (log_dir / "generate.stderr").open("w")
    process = subprocess.Popen(argv, env=cli_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)
    process.stderr_path = log_dir / "generate.stderr"
    stderr.close()
    return process


def stderr_tail(process: subprocess.Popen) -> str:
    return process.stderr_path.read_text()[-3000:]


def _wait_for_rows(output: Path, at_least: int, process: subprocess.Popen, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = len(complete_rows(output)) if output.exists() else 0
        if count >= at_least:
            return count
        if process.poll() is not None:
            raise AssertionError(f"generate exited ({process.returncode}) before writing {at_least} rows:\n"
                                 f"{stderr_tail(process)}")
        time.sleep(0.02)
    raise AssertionError(f"fewer than {at_least} rows after {timeout} s")


# Enough samples (at concurrency 4) that the kill after KILL_AFTER_ROWS rows lands mid-run even on an
# idle machine: vLLM answers the 120 in about 10 s at concurrency 8 here, llama-server in about 4 s.
KILL_TEST_SAMPLES = 120
KILL_AFTER_ROWS = 4
KILL_TEST_CONCURRENCY = "4"


def crash_mid_run(engine, output: Path, process: subprocess.Popen) -> int:
    """SIGKILL the engine once KILL_AFTER_ROWS rows are written; the rows written by then.

    The engine is frozen (SIGSTOP) the moment the rows are seen, so the count is the one the crash
    left, however long this process waits for a CPU between the poll, the count and the kill."""
    started = time.monotonic()
    seen = _wait_for_rows(output, KILL_AFTER_ROWS, process)
    engine.pause()
    written = len(complete_rows(output))
    engine.kill()
    assert written < KILL_TEST_SAMPLES, (
        f"the run finished before the engine was killed: {seen} rows seen after "
        f"{time.monotonic() - started:.1f} s, {written} when it was frozen")
    return written


def test_engine_killed_mid_run_and_restarted_the_run_finishes_with_every_sample_once(engine, tmp_path, tiny_tokenizer):
    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, KILL_TEST_SAMPLES, seed=11)
    output = tmp_path / "out"
    process = spawn_generate(
        generate_argv(prompts, output, engine, "--concurrency", KILL_TEST_CONCURRENCY, "--health-interval", "0.5",
                      "--endpoint-wait", "240", "--max-retries", "20"),
        tmp_path,
    )
    try:
        crash_mid_run(engine, output, process)
        time.sleep(1.0)  # in-flight requests fail; the client must hold them, not drop them
        engine.start()
        stdout, _ = process.communicate(timeout=400)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr_tail(process)
    summary = _summary(stdout)
    rows = complete_rows(output)
    assert_exactly_once(rows, ids)
    for row in rows:
        assert_row_captures_the_completion(row, engine, tiny_tokenizer)
    assert_mostly_answered(rows)
    assert summary["done"] == KILL_TEST_SAMPLES == summary["input"]
    # The client saw the engine go away (requests in flight at the kill were retried or requeued).
    assert summary["retries"] + summary["requeued"] > 0, summary
    assert summary["done"] + summary["failed"] + summary["skipped"] + summary["remaining"] == summary["input"]


def test_engine_and_client_crash_then_rerun_resumes_without_loss_or_duplicates(engine, tmp_path, tiny_tokenizer):
    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, KILL_TEST_SAMPLES, seed=13)
    output = tmp_path / "out"
    process = spawn_generate(
        generate_argv(prompts, output, engine, "--concurrency", KILL_TEST_CONCURRENCY),
        tmp_path,
    )
    try:
        # The whole node goes down: engine and client die at once, nothing is shut down cleanly.
        crash_mid_run(engine, output, process)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    survived = complete_rows(output)
    assert KILL_AFTER_ROWS <= len(survived) < KILL_TEST_SAMPLES
    assert len({row["id"] for row in survived}) == len(survived)

    engine.start()
    result, summary = run_generate(prompts, output, engine, "--concurrency", "8")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = complete_rows(output)
    assert_exactly_once(rows, ids)
    for row in rows:
        assert_row_captures_the_completion(row, engine, tiny_tokenizer)
    assert_mostly_answered(rows)
    assert summary["input"] == KILL_TEST_SAMPLES
    assert summary["already_done"] == len(survived)
    assert summary["done"] == KILL_TEST_SAMPLES - len(survived)
    assert summary["done"] + summary["failed"] + summary["skipped"] + summary["remaining"] == summary["input"]


def _two_engine_argv(prompts: Path, output: Path, vllm_engine, llama_engine, *extra: str) -> list[str]:
    argv = generate_argv(prompts, output, vllm_engine, *extra)
    return argv + ["--endpoint", llama_engine.api_url]


def test_one_run_over_both_engines_captures_reasoning_from_either_field(
    vllm_engine, llama_engine, tmp_path, tiny_tokenizer
):
    # vLLM answers in `reasoning`, llama-server in `reasoning_content`; the rows must not differ.
    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, 48, seed=17)
    output = tmp_path / "out"
    result = subprocess.run(
        _two_engine_argv(prompts, output, vllm_engine, llama_engine, "--concurrency", "4"),
        env=cli_env(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(result.stdout)
    assert summary["done"] == 48
    rows = complete_rows(output)
    assert_exactly_once(rows, ids)
    served_by = Counter()
    for row in rows:
        engine = vllm_engine if str(vllm_engine.port) in row["endpoint"] else llama_engine
        served_by[engine.kind] += 1
        assert_row_captures_the_completion(row, engine, tiny_tokenizer)
    assert served_by["vllm"] > 0 and served_by["llama-server"] > 0, served_by


def test_an_engine_dying_for_good_mid_run_leaves_its_work_to_the_other(
    vllm_engine, make_llama_server, tmp_path, tiny_tokenizer
):
    doomed = make_llama_server().start()
    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, KILL_TEST_SAMPLES, seed=19)
    output = tmp_path / "out"
    process = spawn_generate(
        _two_engine_argv(prompts, output, vllm_engine, doomed, "--concurrency", "4",
                         "--health-interval", "0.5"),
        tmp_path,
    )
    try:
        crash_mid_run(doomed, output, process)  # and it never comes back
        stdout, _ = process.communicate(timeout=400)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr_tail(process)
    summary = _summary(stdout)
    rows = complete_rows(output)
    assert_exactly_once(rows, ids)
    for row in rows:
        engine = vllm_engine if str(vllm_engine.port) in row["endpoint"] else doomed
        assert_row_captures_the_completion(row, engine, tiny_tokenizer)
    assert summary["done"] == KILL_TEST_SAMPLES
    assert summary["done"] + summary["failed"] + summary["skipped"] + summary["remaining"] == summary["input"]


def test_the_thinking_default_reads_llama_servers_template_and_vllm_tells_none(llama_engine, vllm_engine):
    import asyncio

    from draftsmith.client.chat import ChatClient
    from draftsmith.data.thinking import choose_thinking

    async def templates():
        async with ChatClient(connections=2, timeout_s=30) as client:
            return await client.chat_template(llama_engine.base_url), await client.chat_template(vllm_engine.base_url)

    llama, vllm = asyncio.run(templates())
    assert choose_thinking(llama).support == "switch"  # the tiny target's template, served from its GGUF
    assert vllm is None and choose_thinking(vllm).kwargs == {"enable_thinking": True}  # unknown: as before
