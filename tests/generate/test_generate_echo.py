"""`generate` end to end against real `draftsmith serve --backend echo` processes with faults."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from draftsmith.cli import main
from draftsmith.generate import GenerateConfig, generate
from draftsmith.serve.process import ServeProcess

from .conftest import assert_exactly_once, read_rows


def config(prompts, out, endpoints, **overrides):
    values = dict(inputs=[prompts], output_dir=out, endpoints=endpoints, progress=False, concurrency=16,
                  backoff_base_s=0.02, backoff_max_s=0.2, health_interval_s=0.3, endpoint_wait_s=30)
    values.update(overrides)
    return GenerateConfig(**values)


def test_rows_follow_contract_and_resume_skips_done(tmp_path, prompts_file):
    prompts = prompts_file(120)
    with ServeProcess(["--backend", "echo", "--served-model-name", "target"]) as server:
        summary = generate(config(prompts, tmp_path / "out", [server.url], limit=50))
        assert (summary.done, summary.remaining, summary.accounted) == (50, 70, True)
        summary = generate(config(prompts, tmp_path / "out", [server.url + "/v1"]))
    assert summary.ok and summary.already_done == 50 and summary.done == 70 and summary.skipped == 50
    rows = assert_exactly_once(tmp_path / "out", prompts)
    row = rows[0]
    assert set(row) == {"id", "messages", "finish_reason", "prompt_tokens", "completion_tokens", "reasoning_tokens",
                        "prompt_token_ids", "completion_token_ids", "model", "endpoint", "latency_s"}
    assistant = row["messages"][-1]
    assert assistant["role"] == "assistant" and assistant["reasoning_content"].startswith("Let me think about")
    assert assistant["content"].startswith("The answer to")
    assert row["model"] == "target" and row["endpoint"] == server.url and row["finish_reason"] == "stop"
    assert len(row["completion_token_ids"]) == row["completion_tokens"] and row["reasoning_tokens"] > 0
    saved = json.loads((tmp_path / "out" / "summary-s0of1.json").read_text())
    assert saved["ok"] and saved["input"] == 120


def test_transient_errors_and_dropped_connections_are_retried(tmp_path, prompts_file):
    prompts = prompts_file(200)
    args = ["--fail-rate", "0.25", "--fail-status", "503", "--drop-rate", "0.1", "--seed", "4"]
    with ServeProcess(args) as server:
        summary = generate(config(prompts, tmp_path / "out", [server.url], stream=True))
    assert summary.ok, summary.problems()
    assert summary.retries >= 30
    assert_exactly_once(tmp_path / "out", prompts)


def test_permanent_failures_are_recorded_then_retried(tmp_path, prompts_file):
    prompts = prompts_file(100)
    with ServeProcess(["--fail-rate", "0.2", "--fail-status", "400", "--seed", "2"]) as server:
        summary = generate(config(prompts, tmp_path / "out", [server.url]))
    assert summary.accounted and summary.failed > 5 and summary.done + summary.failed == 100
    failures = [json.loads(line) for line in (tmp_path / "out" / "failures-s0of1.jsonl").read_text().splitlines()]
    assert len(failures) == summary.failed and all("HTTP 400: injected failure" in f["reason"] for f in failures)
    with ServeProcess() as server:
        skipped = generate(config(prompts, tmp_path / "out", [server.url], retry_failed=False))
        assert skipped.skipped_failed == summary.failed and skipped.done == 0 and skipped.accounted
        retried = generate(config(prompts, tmp_path / "out", [server.url]))
    assert retried.ok and retried.done == summary.failed
    assert_exactly_once(tmp_path / "out", prompts)


def test_engine_crash_then_restart_and_resume(tmp_path, prompts_file):
    """The engine dies mid-run; the run stops cleanly; after a restart a rerun completes exactly once."""
    prompts = prompts_file(300)
    with ServeProcess(["--die-after", "120", "--delay", "0.005"]) as server:
        first = generate(config(prompts, tmp_path / "out", [server.url], endpoint_wait_s=1.5))
        assert not server.running
        assert first.accounted and first.remaining > 0 and first.done >= 80
        assert "no endpoint healthy" in first.stopped_reason
        server.restart(["--delay", "0.005"])
        second = generate(config(prompts, tmp_path / "out", [server.url]))
    assert second.ok and second.already_done == first.done and second.done == first.remaining
    assert_exactly_once(tmp_path / "out", prompts)


def test_kill_mid_run_and_restart_while_the_run_waits(tmp_path, prompts_file):
    """SIGKILL the engine while requests are in flight, bring it back: the same run finishes."""
    prompts = prompts_file(400)
    out = tmp_path / "out"
    with ServeProcess(["--delay", "0.02"]) as server:
        result = {}
        thread = threading.Thread(target=lambda: result.update(summary=generate(config(prompts, out, [server.url]))))
        thread.start()
        deadline = time.monotonic() + 60
        while len(read_rows(out)) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()
        time.sleep(1.0)
        server.start()
        thread.join(120)
    summary = result["summary"]
    assert summary.ok, summary.problems()
    assert summary.requeued + summary.retries > 0
    assert_exactly_once(out, prompts)


def test_least_outstanding_dispatch_and_dead_endpoint(tmp_path, prompts_file):
    prompts = prompts_file(300)
    with ServeProcess() as fast, ServeProcess(["--delay", "0.3"]) as slow, ServeProcess() as doomed:
        dead_url = doomed.url
        doomed.kill()
        summary = generate(config(prompts, tmp_path / "out", [fast.url, slow.url, dead_url], concurrency=4))
    assert summary.ok, summary.problems()
    by_url = {e["url"]: e for e in summary.endpoints}
    assert by_url[dead_url]["completed"] == 0 and not by_url[dead_url]["healthy"]
    assert by_url[fast.url]["completed"] > 3 * by_url[slow.url]["completed"] > 0
    assert_exactly_once(tmp_path / "out", prompts)


def test_shards_split_and_merge(tmp_path, prompts_file):
    prompts = prompts_file(150)
    with ServeProcess() as server:
        first = generate(config(prompts, tmp_path / "out", [server.url], shard_index=0, shard_count=2))
        second = generate(config(prompts, tmp_path / "out", [server.url], shard_index=1, shard_count=2))
    assert first.ok and second.ok and first.input + second.input == 150 and first.input > 40
    assert_exactly_once(tmp_path / "out", prompts)


def test_quality_guard_stops_the_run_via_cli(tmp_path, prompts_file, capsys):
    prompts = prompts_file(400)
    with ServeProcess(["--echo-answer", "OK.", "--echo-reasoning", "", "--delay", "0.01"]) as server:
        code = main(["generate", str(prompts), "-o", str(tmp_path / "out"), "-e", server.url, "--no-progress",
                     "--concurrency", "8", "--guard-min-samples", "30", "--guard-window", "50"])
    assert code == 3
    assert "quality guard" in capsys.readouterr().err
    rows = read_rows(tmp_path / "out")
    assert 30 <= len(rows) < 100
    summary = json.loads((tmp_path / "out" / "summary-s0of1.json").read_text())
    assert summary["guard_tripped"] and summary["accounted"] and summary["remaining"] == 400 - len(rows)


def test_cli_bad_input_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"messages": 3}\n')
    assert main(["generate", str(bad), "-o", str(tmp_path / "out"), "--no-progress"]) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    assert main(["generate", str(bad), "-o", str(tmp_path / "out"), "--shard", "2/2"]) == 2


def test_generate_works_inside_a_running_event_loop(tmp_path, prompts_file):
    prompts = prompts_file(20)
    with ServeProcess() as server:
        async def notebook_cell():
            return generate(config(prompts, tmp_path / "out", [server.url], order="longest-first"))

        summary = asyncio.run(notebook_cell())
    assert summary.ok and summary.done == 20
    lengths = [sum(len(m["content"]) for m in row["messages"][:-1]) for row in read_rows(tmp_path / "out")]
    assert lengths[0] == max(lengths)


def test_streamed_chunks_longer_than_64k_are_read(tmp_path):
    prompts = tmp_path / "long.jsonl"
    words = " ".join(f"w{i}" for i in range(20000))
    prompts.write_text(json.dumps({"id": "long", "messages": [{"role": "user", "content": words}]}) + "\n")
    with ServeProcess() as server:
        summary = generate(config(prompts, tmp_path / "out", [server.url], stream=True))
    assert summary.ok, summary.problems()
    (row,) = read_rows(tmp_path / "out")
    assert len(row["prompt_token_ids"]) == row["prompt_tokens"] == 20000


@pytest.mark.parametrize("failure", ["killed", "hung"])
def test_failed_endpoint_mid_run_is_taken_out_and_its_requests_requeued(tmp_path, prompts_file, failure):
    prompts = prompts_file(600)
    out = tmp_path / "out"
    with ServeProcess(["--delay", "0.02"]) as healthy, ServeProcess(["--delay", "0.02"]) as failing:
        result = {}
        run_config = config(prompts, out, [healthy.url, failing.url], concurrency=8, health_timeout_s=0.5,
                            request_timeout_s=60)
        thread = threading.Thread(target=lambda: result.update(summary=generate(run_config)))
        thread.start()
        deadline = time.monotonic() + 60
        while len(read_rows(out)) < 100 and time.monotonic() < deadline:
            time.sleep(0.02)
        failing.kill() if failure == "killed" else failing.pause()
        thread.join(120)
        finished_rows = len(read_rows(out))
    summary = result["summary"]
    assert summary.ok, summary.problems()
    by_url = {e["url"]: e for e in summary.endpoints}
    assert not by_url[failing.url]["healthy"]
    if failure == "hung":  # requests stuck on the hung engine were cancelled and sent elsewhere
        assert summary.requeued > 0
    assert finished_rows == 600
    assert_exactly_once(out, prompts)


def test_summary_rescans_the_output_and_reports_duplicates(tmp_path, prompts_file):
    prompts = prompts_file(30)
    with ServeProcess() as server:
        first = generate(config(prompts, tmp_path / "out", [server.url]))
        assert first.ok and first.on_disk == 30 and first.duplicates_on_disk == 0
        # Someone concatenates a part onto itself: the next run must not call that OK.
        part = next((tmp_path / "out").glob("generated-*.jsonl"))
        part.write_text(part.read_text() + part.read_text().splitlines(keepends=True)[0])
        second = generate(config(prompts, tmp_path / "out", [server.url]))
    assert second.done == 0 and second.duplicates_on_disk == 1 and not second.ok
    assert any("duplicate rows" in problem for problem in second.problems())


@pytest.mark.parametrize("status, attempts", [(503, 3), (400, 1)])
def test_failures_file_counts_every_attempt_once(tmp_path, prompts_file, status, attempts):
    prompts = prompts_file(4)
    with ServeProcess(["--fail-rate", "1", "--fail-status", str(status)]) as server:
        summary = generate(config(prompts, tmp_path / "out", [server.url], max_retries=2))
    assert summary.failed == 4 and summary.retries == 4 * (attempts - 1)
    failures = [json.loads(line) for line in (tmp_path / "out" / "failures-s0of1.jsonl").read_text().splitlines()]
    assert [f["attempts"] for f in failures] == [attempts] * 4


def test_resume_with_other_settings_is_refused_unless_forced(tmp_path, prompts_file, capsys):
    prompts = prompts_file(12)
    out = tmp_path / "out"
    with ServeProcess(["--backend", "echo", "--served-model-name", "target"]) as server:
        first = generate(config(prompts, out, [server.url], limit=4, max_tokens=64))
        assert first.done == 4
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["stage"] == "generate" and manifest["settings"]["model"] == "target"
        assert manifest["settings"]["chat_template_kwargs"] == {"enable_thinking": True}
        args = ["generate", str(prompts), "-o", str(out), "-e", server.url, "--no-progress", "--max-tokens", "64"]
        assert main([*args, "--no-thinking"]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after the "resuming: ..." log line
        assert err.startswith("draftsmith: error:") and 'chat_template_kwargs: {"enable_thinking": true} -> {"enable_thinking": false}' in err
        assert main([*args[:-1], "128"]) == 2
        assert "max_tokens: 64 -> 128" in capsys.readouterr().err
        assert len(read_rows(out)) == 4  # nothing was written by the refused runs
        assert main([*args[:-1], "128", "--force-resume"]) == 0
    assert "continuing with changed settings (max_tokens: 64 -> 128)" in " ".join(capsys.readouterr().err.split())
    assert json.loads((out / "manifest.json").read_text())["settings"]["max_tokens"] == 128
    assert_exactly_once(out, prompts)


@pytest.mark.parametrize("thinking", [True, False])
def test_a_row_without_a_think_block_says_none_not_empty(tmp_path, prompts_file, thinking):
    prompts = prompts_file(3)
    with ServeProcess(["--backend", "echo"]) as server:
        generate(config(prompts, tmp_path / "out", [server.url], chat_template_kwargs={"enable_thinking": thinking}))
    turns = [row["messages"][-1] for row in read_rows(tmp_path / "out")]
    assert len(turns) == 3
    if thinking:
        assert all(turn["reasoning_content"] for turn in turns)
    else:
        assert all(turn["reasoning_content"] is None for turn in turns)


def test_a_target_template_without_thinking_sets_the_default_and_the_guard_adapts(tmp_path, prompts_file, capsys):
    from draftsmith.tiny.families import build_family_target

    target = build_family_target("llama3", tmp_path / "llama3")  # its template has no thinking switch
    prompts = prompts_file(80)
    out = tmp_path / "out"
    with ServeProcess(["--echo-reasoning", "", "--delay", "0.005"]) as server:
        args = ["generate", str(prompts), "-o", str(out), "-e", server.url, "--no-progress", "--concurrency", "8",
                "--guard-min-samples", "30", "--guard-window", "50", "--target", str(target)]
        assert main([*args, "--limit", "40"]) == 1  # 40 remain; no guard trip on answers without reasoning
        err = " ".join(capsys.readouterr().err.split())
        assert "thinking off (default; enable_thinking not sent)" in err and "quality guard" not in err
        assert json.loads((out / "manifest.json").read_text())["settings"]["chat_template_kwargs"] == {}
        # The same default, or --no-thinking (which such a template ignores), resumes without --force-resume.
        assert main([*args, "--no-thinking"]) == 0
        assert "thinking off (as asked" in " ".join(capsys.readouterr().err.split())
        # Finished: a rerun sends nothing and asks no template, so it keeps the recorded mode, --target or not.
        assert main(args[:-2]) == 0
    assert_exactly_once(out, prompts)


def test_answers_cut_at_max_tokens_are_warned_about_as_the_run_goes(tmp_path, prompts_file, capsys):
    prompts = prompts_file(60)
    with ServeProcess(["--echo-reasoning", ""]) as server:
        code = main(["generate", str(prompts), "-o", str(tmp_path / "out"), "-e", server.url, "--no-progress",
                     "--max-tokens", "8", "--max-length-finish", "1.0", "--max-empty-reasoning", "1.0",
                     "--guard-min-samples", "20", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    err = " ".join(captured.err.split())
    assert "answers hit --max-tokens 8 (finish_reason 'length')" in err and err.count("answers hit --max-tokens") == 1
    summary = json.loads(captured.out)
    rows = read_rows(tmp_path / "out")
    assert summary["length_finished"] == sum(row.get("finish_reason") == "length" for row in rows) > 0
