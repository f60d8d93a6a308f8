"""Server misbehaviour and hostile output directories: never a bad row, a hang or a write outside.

Every case runs a real `draftsmith serve` fault-injecting process; the CLI cases run
`python -m draftsmith generate` as a real process too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftsmith.data.generated import incomplete_answer
from draftsmith.generate import generate
from draftsmith.serve.process import ServeProcess

from .conftest import assert_exactly_once, read_rows
from .test_generate_echo import config

SRC = Path(__file__).resolve().parents[2] / "src"


def run_cli(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "draftsmith", "generate", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    *logs, error = result.stderr.strip().splitlines()  # after any "resuming: ..." log line
    assert error.startswith("draftsmith: error: ") and all(line.startswith("draftsmith generate: ") for line in logs)
    return error


def failures(out: Path) -> list[dict]:
    path = out / "failures-s0of1.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_stream_cut_before_its_finish_reason_is_retried_never_written(tmp_path, prompts_file):
    prompts = prompts_file(80)
    with ServeProcess(["--cut-stream-rate", "0.3", "--seed", "5"]) as server:
        summary = generate(config(prompts, tmp_path / "out", [server.url], stream=True))
    assert summary.ok, summary.problems()
    assert summary.retries >= 10
    rows = assert_exactly_once(tmp_path / "out", prompts)
    assert all(row["finish_reason"] == "stop" and incomplete_answer(row) is None for row in rows)
    assert all(row["messages"][-1]["content"].startswith("The answer to") for row in rows)


def test_a_stream_that_is_always_cut_ends_as_recorded_failures(tmp_path, prompts_file):
    prompts = prompts_file(5)
    with ServeProcess(["--cut-stream-rate", "1"]) as server:
        summary = generate(config(prompts, tmp_path / "out", [server.url], stream=True, max_retries=1))
    assert summary.failed == 5 and summary.done == 0 and summary.accounted
    assert read_rows(tmp_path / "out") == []
    assert all("without a finish_reason and [DONE]" in f["reason"] and f["attempts"] == 2
               for f in failures(tmp_path / "out"))


@pytest.mark.parametrize("content, reason", [("null", "content is null"), ("number", "content is a int")])
def test_content_null_or_a_number_is_refused_then_retried_by_a_rerun(tmp_path, prompts_file, content, reason):
    prompts = prompts_file(60)
    out = tmp_path / "out"
    with ServeProcess(["--bad-content-rate", "0.3", "--bad-content", content, "--seed", "3"]) as server:
        first = generate(config(prompts, out, [server.url]))
    assert first.accounted and first.failed >= 5 and first.done + first.failed == 60
    assert all(isinstance(row["messages"][-1]["content"], str) and incomplete_answer(row) is None
               for row in read_rows(out))
    assert len(failures(out)) == first.failed and all(reason in f["reason"] for f in failures(out))
    with ServeProcess() as server:
        second = generate(config(prompts, out, [server.url]))
    assert second.ok and second.done == first.failed
    assert_exactly_once(out, prompts)


@pytest.mark.parametrize("retry_after", ["1e12", "inf", "nan", "-5"])
def test_a_huge_or_non_finite_retry_after_is_capped_by_backoff_max(tmp_path, prompts_file, retry_after):
    prompts = prompts_file(6)
    out = tmp_path / "out"
    with ServeProcess(["--fail-first", "4", "--fail-status", "429", "--retry-after", retry_after]) as server:
        started = time.monotonic()
        result = run_cli([str(prompts), "-o", str(out), "-e", server.url, "--no-progress", "--backoff-max-s", "0.3",
                          "--backoff-base-s", "0.05", "--json"], timeout=90)
        elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary["ok"] and summary["retries"] == 4 and elapsed < 60
    assert len(read_rows(out)) == 6


def test_an_http_date_retry_after_is_honoured(tmp_path, prompts_file):
    """RFC 9110 allows `Retry-After: <HTTP-date>`; it is waited for (up to --backoff-max-s), not ignored."""
    from email.utils import formatdate

    from draftsmith.client.chat import parse_retry_after

    assert parse_retry_after("Fri, 04 Dec 2026 17:00:30 GMT", now=1796403600.0) == 30.0
    assert parse_retry_after("Fri, 04 Dec 2026 16:59:00 GMT", now=1796403600.0) == 0.0
    assert parse_retry_after("not a date") is None
    prompts = prompts_file(2)
    out = tmp_path / "out"
    an_hour_ahead = formatdate(time.time() + 3600, usegmt=True)
    with ServeProcess(["--fail-first", "2", "--fail-status", "503", "--retry-after", an_hour_ahead]) as server:
        started = time.monotonic()
        result = run_cli([str(prompts), "-o", str(out), "-e", server.url, "--no-progress", "--backoff-max-s", "1.5",
                          "--backoff-base-s", "0.01", "--concurrency", "1", "--json"], timeout=90)
        elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["retries"] == 2
    assert elapsed >= 3.0, f"{elapsed:.2f}s: the date was ignored (two retries capped at 1.5 s each)"
    assert len(read_rows(out)) == 2


def test_a_second_shard_count_on_one_directory_is_refused(tmp_path, prompts_file):
    prompts = prompts_file(40)
    out = tmp_path / "out"
    with ServeProcess() as server:
        base = [str(prompts), "-o", str(out), "-e", server.url, "--no-progress"]
        assert run_cli([*base, "--shard", "0/2"]).returncode == 0
        def contents():  # all but the (empty) lock files
            return {path.name: path.read_bytes() for path in out.iterdir() if not path.name.startswith(".draftsmith.")}

        before = contents()
        error = one_line_error(run_cli([*base, "--shard", "0/3"]))
        assert contents() == before  # the refused run wrote nothing
        assert run_cli([*base, "--shard", "1/2"]).returncode == 0  # the same N: disjoint shards, one dataset
    assert str(out) in error and "shard_count: 2 -> 3" in error
    assert_exactly_once(out, prompts)



def test_a_finished_run_resumed_with_other_settings_is_refused_too(tmp_path, prompts_file):
    # Every sample done: the run returned before the manifest check, exit 0 under another --shard N
    # or --max-tokens, and wrote that shard's summary into the directory.
    prompts = prompts_file(12)
    out = tmp_path / "out"
    with ServeProcess() as server:
        base = [str(prompts), "-o", str(out), "-e", server.url, "--no-progress"]
        assert run_cli(base).returncode == 0
        before = {path.name: path.read_bytes() for path in out.iterdir() if not path.name.startswith(".draftsmith.")}
        assert run_cli(base).returncode == 0  # the same settings: nothing to do, fine
        shard_error = one_line_error(run_cli([*base, "--shard", "0/2"]))
        tokens_error = one_line_error(run_cli([*base, "--max-tokens", "7"]))
        after = {path.name: path.read_bytes() for path in out.iterdir() if not path.name.startswith(".draftsmith.")}
    assert "shard_count: 1 -> 2" in shard_error and "max_tokens:" in tokens_error and "-> 7" in tokens_error
    assert set(after) == set(before) and all(after[name] == before[name] for name in before if "summary" not in name)
    assert_exactly_once(out, prompts)

def test_a_symlinked_shard_is_refused_before_anything_is_cut_or_written(tmp_path, prompts_file):
    prompts = prompts_file(10)
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "precious.jsonl"
    outside.write_text('{"id": "x", "messages": []}\n{"id": "torn", "mess')  # a torn-looking last line
    original = outside.read_bytes()
    link = out / "generated-s0of1-00000.jsonl"
    link.symlink_to(outside)
    with ServeProcess() as server:
        error = one_line_error(run_cli([str(prompts), "-o", str(out), "-e", server.url, "--no-progress"]))
    assert str(link) in error and "symbolic link" in error
    assert outside.read_bytes() == original
    assert sorted(path.name for path in out.iterdir()) == [link.name]


@pytest.mark.parametrize("name", ["failures-s0of1.jsonl", ".draftsmith.s0of1.lock", "progress-s0of1.json"])
def test_a_symlinked_state_file_is_refused_too(tmp_path, prompts_file, name):
    prompts = prompts_file(3)
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    (out / name).symlink_to(outside)
    with ServeProcess(["--fail-rate", "1", "--fail-status", "400"]) as server:
        error = one_line_error(run_cli([str(prompts), "-o", str(out), "-e", server.url, "--no-progress"]))
    assert name in error and "symbolic link" in error and outside.read_text() == "keep me\n"


def test_invalid_utf8_in_an_existing_shard_is_a_one_line_error(tmp_path, prompts_file):
    prompts = prompts_file(3)
    out = tmp_path / "out"
    out.mkdir()
    shard = out / "generated-s0of1-00000.jsonl"
    shard.write_bytes(b'{"id": "a", "messages": []}\n{"id": "b\xff\xfe", "messages": []}\n')
    with ServeProcess() as server:
        error = one_line_error(run_cli([str(prompts), "-o", str(out), "-e", server.url, "--no-progress"]))
    assert f"{shard}:2" in error and "not UTF-8" in error
