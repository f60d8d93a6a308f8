"""`generate` finishes against a busy real llama-server: few slots, long answers, more requests than
slots, a loaded CPU, and nothing cancelled.

A busy llama-server answers `/health` slowly (its HTTP threads starved of CPU, or, in older builds,
queued behind requests waiting for a slot). `generate` used to call it down after one health check
slower than 5 s, cancel every request and send them again, forever (0 of 48 rows in 4 minutes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_generate_engines import cli_env, complete_rows, write_prompts

pytestmark = pytest.mark.timeout(600)

SLOTS = 2
ANSWER_TOKENS = 2048  # every answer is this long: the run outlasts several health checks


@pytest.fixture
def loaded_cpu():
    """A process spinning on the machine for the whole test, as another user's job would."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


@pytest.mark.parametrize("concurrency", [None, 6], ids=["default", "more-than-slots"])
def test_generate_finishes_every_row_on_a_busy_llama_server_and_cancels_nothing(
    tmp_path, make_llama_server, loaded_cpu, concurrency
):
    # One thread: on this loaded 2-core machine two ran 256 tokens in 19.1 s against 0.5 s.
    engine = make_llama_server(parallel=SLOTS, threads=1).start()
    prompts = tmp_path / "prompts.jsonl"
    ids = write_prompts(prompts, 6)
    out = tmp_path / "out"
    argv = [
        sys.executable, "-m", "draftsmith", "generate", str(prompts), "-o", str(out), "-e", engine.api_url,
        "--no-progress", "--json", "--temperature", "0", "--max-tokens", str(ANSWER_TOKENS),
        "--extra-body", '{"ignore_eos": true}',  # every answer runs to --max-tokens: long, and all alike
        "--max-length-finish", "1.0", "--warn-length-finish", "1.0",  # the rest on the defaults, health checks too
    ]  # fmt: skip
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    try:
        result = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=420)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"generate did not finish against a busy llama-server:\n{error.stderr}")
    stderr = " ".join(result.stderr.split())
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(result.stdout)
    assert summary["ok"] and summary["done"] == 6, summary
    assert summary["requeued"] == 0 and summary["retries"] == 0, stderr  # no request cancelled, none resent
    assert "is down" not in stderr, stderr
    if concurrency is None:  # the default: what the engine runs at once, read from its /props
        assert f"concurrency {SLOTS} on {engine.base_url}" in stderr, stderr
    else:
        assert f"--concurrency 6 is more than the {SLOTS} requests {engine.base_url} runs at once" in stderr, stderr
    rows = complete_rows(out)
    assert sorted(row["id"] for row in rows) == sorted(ids)
    # Every answer ran to --max-tokens (the row's count leaves out a few of the tokens the cap counts).
    assert all(row["finish_reason"] == "length" and row["completion_tokens"] > 0.9 * ANSWER_TOKENS for row in rows), [
        (row["completion_tokens"], row["finish_reason"]) for row in rows]



def test_the_slots_of_vllm_are_its_max_num_seqs(tiny_target_dir, start_vllm):
    """vLLM 0.32 puts no max_num_seqs on /metrics; with VLLM_SERVER_DEV_MODE=1 its /server_info has it."""
    import asyncio

    from draftsmith.client.chat import ChatClient

    server = start_vllm(tiny_target_dir, "dev-mode", env={"VLLM_SERVER_DEV_MODE": "1"},
                        extra_args=["--max-num-seqs", "5"], startup_timeout_s=480)

    async def slots() -> int | None:
        async with ChatClient() as client:
            return await client.engine_slots(server.base_url)

    assert asyncio.run(slots()) == 5
