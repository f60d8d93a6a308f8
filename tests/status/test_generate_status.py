"""`draftsmith status` on generate directories, against real `draftsmith serve` fault-injecting
processes and real `draftsmith generate` processes (killed with SIGKILL, hung, resumed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from draftsmith.core.errors import InputError
from draftsmith.generate import GenerateConfig, generate
from draftsmith.serve.process import ServeProcess
from draftsmith.status import StatusConfig, status

from .conftest import environment, row_count, run_status, start_generate, wait_for_rows


def test_live_run_then_kill_9_then_resume(tmp_path, prompts_file):
    prompts, out = prompts_file(500), tmp_path / "out"
    with ServeProcess(["--delay", "0.1"]) as server:
        writer = start_generate(prompts, out, server.url, "--concurrency", "2")
        try:
            wait_for_rows(out, 20)
            code, first, _ = run_status(out)
            assert (code, first["stage"], first["state"], first["writer_alive"], first["total"]) == (0, "generate", "running", True, 500)
            time.sleep(1.0)
            code, second, _ = run_status(out, "--window", "10m")
            assert code == 0 and first["done"] < second["done"] < 500
            assert second["rows_per_s"] > 0 and second["output_tokens_per_s"] > 0 and second["eta_s"] > 0
            assert second["lengths"]["rows"] == second["done"] and second["lengths"]["p50"] > 0
            os.kill(writer.pid, signal.SIGKILL)
            time.sleep(0.3)
            code, dead, _ = run_status(out)  # the killed writer is not reaped yet (a zombie): still dead
        finally:
            writer.kill()
            writer.wait()
        assert (code, dead["state"], dead["writer_alive"]) == (1, "dead", False)
        assert dead["done"] == row_count(out) and dead["shards"][0]["state"] == "dead"
        assert dead["rows_per_s"] is None and dead["eta_s"] is None  # a dead writer makes no progress: no ETA
        resumed = subprocess.run([sys.executable, "-m", "draftsmith", "generate", str(prompts), "-o", str(out), "-e",
                                  server.url, "--no-progress", "--concurrency", "8"], env=environment(),
                                 capture_output=True, text=True, timeout=180)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
    code, final, _ = run_status(out)
    assert (code, final["state"], final["done"], final["total"], final["writer_alive"]) == (0, "finished", 500, 500, False)
    assert final["done"] == row_count(out) and final["failures"] == {} and final["eta_s"] == 0


def test_a_hung_engine_is_reported_as_stalled(tmp_path, prompts_file):
    prompts, out = prompts_file(400), tmp_path / "out"
    with ServeProcess(["--delay", "0.05"]) as server:
        writer = start_generate(prompts, out, server.url, "--concurrency", "2", "--endpoint-wait", "300",
                                "--health-timeout-s", "0.5")  # fmt: skip
        try:
            wait_for_rows(out, 10)
            code, running, _ = run_status(out, "--stall-after", "3s")
            assert (code, running["state"]) == (0, "running")
            server.pause()
            time.sleep(4.5)
            code, stalled, _ = run_status(out, "--stall-after", "3s")
        finally:
            server.resume()
            writer.kill()
            writer.wait()
    assert (code, stalled["state"], stalled["writer_alive"]) == (1, "stalled", True)
    assert stalled["last_write_age_s"] > 3 and any("no row written" in alert for alert in stalled["alerts"])


def _config(prompts, out, url, **overrides) -> GenerateConfig:
    values = dict(inputs=[prompts], output_dir=out, endpoints=[url], progress=False, concurrency=16,
                  backoff_base_s=0.02, backoff_max_s=0.2, health_interval_s=0.3)  # fmt: skip
    return GenerateConfig(**{**values, **overrides})


def _snapshot(directory):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir())


def test_two_shard_directories_aggregate_exactly(tmp_path, prompts_file):
    prompts = prompts_file(300)
    shard_dirs = [tmp_path / "node0", tmp_path / "node1"]
    with ServeProcess(["--fail-rate", "0.05", "--fail-status", "400", "--seed", "3"]) as server:
        for index, directory in enumerate(shard_dirs):
            summary = generate(_config(prompts, directory, server.url, shard_index=index, shard_count=2))
            assert summary.accounted and summary.failed > 0
    failed = sum(len((d / f"failures-s{i}of2.jsonl").read_text().splitlines()) for i, d in enumerate(shard_dirs))
    view = status(StatusConfig(dirs=shard_dirs))
    rows = [row_count(d) for d in shard_dirs]
    assert (view.state, view.done, view.total, view.failed) == ("finished", sum(rows), 300, failed)
    assert [(s.name, s.done, s.state) for s in view.shards] == [("s0of2", rows[0], "finished"), ("s1of2", rows[1], "finished")]
    assert view.failures == {"http_400": failed} and not view.total_estimated and view.exit_code == 0
    assert status(StatusConfig(dirs=[*shard_dirs, shard_dirs[0]])).done == sum(rows)  # one directory named twice

    alone = status(StatusConfig(dirs=shard_dirs[:1]))
    assert alone.total_estimated and alone.state == "dead" and any("s1of2" in alert for alert in alone.alerts)
    copy = tmp_path / "copy"
    shutil.copytree(shard_dirs[0], copy)
    with pytest.raises(InputError, match="shard s0of2 is also in"):
        status(StatusConfig(dirs=[shard_dirs[0], copy, shard_dirs[1]]))


def test_reads_only_and_tolerates_a_half_written_line_and_a_directory_without_a_record(tmp_path, prompts_file):
    prompts, out = prompts_file(120), tmp_path / "out"
    with ServeProcess() as server:
        generate(_config(prompts, out, server.url, limit=80))
    part = next(out.glob("generated-*.jsonl"))
    with part.open("a") as handle:  # a writer caught mid-line
        handle.write('{"id": "half-written", "messages": [')
    before = _snapshot(out)
    view = status(StatusConfig(dirs=[out]))
    assert _snapshot(out) == before  # nothing written, nothing repaired, no lock file made
    assert (view.done, view.total, view.state) == (80, 120, "dead")  # 40 remain and nobody is writing them
    (out / "progress-s0of1.json").unlink()  # a directory written before the progress record existed
    legacy = status(StatusConfig(dirs=[out]))
    assert (legacy.done, legacy.total, legacy.lengths["rows"]) == (80, 120, 80)
    assert legacy.lengths["mean"] == view.lengths["mean"] and legacy.lengths["p90"] == view.lengths["p90"]


def test_the_record_covers_earlier_runs_and_the_tail_only_adds_new_rows(tmp_path, prompts_file):
    prompts, out = prompts_file(90), tmp_path / "out"
    with ServeProcess() as server:
        generate(_config(prompts, out, server.url, limit=30))
        generate(_config(prompts, out, server.url, limit=30))
        generate(_config(prompts, out, server.url))
    record = json.loads((out / "progress-s0of1.json").read_text())
    assert len(record["parts"]) == 3 and sum(p["rows"] for p in record["parts"].values()) == 90
    view = status(StatusConfig(dirs=[out], planned_tokens=10))
    assert (view.done, view.state) == (90, "finished")
    assert view.replan["measured_tokens"] == view.lengths["mean"] and view.replan["change"] == pytest.approx(view.lengths["mean"] / 10 - 1, abs=1e-3)


@pytest.mark.parametrize("case", ["missing", "file", "foreign", "bad-owner", "other-stage", "mixed", "bad-window"])
def test_bad_input_is_a_one_line_error(tmp_path, prompts_file, case):
    target = tmp_path / "dir"
    extra: list = []
    if case == "file":
        target.write_text("x")
    elif case == "foreign":
        target.mkdir()
        (target / "notes.txt").write_text("not ours")
    elif case == "bad-owner":
        target.mkdir()
        (target / ".draftsmith-owner").write_text("{garbage")
    elif case in ("other-stage", "mixed"):
        target.mkdir()
        (target / ".draftsmith-owner").write_text('{"stage": "demo"}' if case == "other-stage" else '{"stage": "train"}')
        if case == "mixed":
            other = tmp_path / "gen"
            other.mkdir()
            (other / ".draftsmith-owner").write_text('{"stage": "generate"}')
            extra = [other]
    elif case == "bad-window":
        target.mkdir()
        (target / ".draftsmith-owner").write_text('{"stage": "train"}')
        extra = ["--window", "soon"]
    code, payload, stderr = run_status(target, *extra)
    assert code == 2 and payload is None, (code, stderr)
    (line,) = stderr.strip().splitlines()
    assert line.startswith("draftsmith: error: ")
    assert str(target) in line or case == "bad-window"


@pytest.mark.parametrize("as_json", [True, False])
def test_watch_redraws_until_ctrl_c(tmp_path, prompts_file, as_json):
    prompts, out = prompts_file(20), tmp_path / "out"
    with ServeProcess() as server:
        generate(_config(prompts, out, server.url))
    command = [sys.executable, "-m", "draftsmith", "status", str(out), "--watch", "0.3", *(["--json"] if as_json else [])]
    process = subprocess.Popen(command, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if as_json:
        views = [json.loads(process.stdout.readline()) for _ in range(3)]  # one object per refresh
        assert [view["state"] for view in views] == ["finished"] * 3
    else:
        time.sleep(4)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    if not as_json:
        assert "draftsmith status: generate  FINISHED" in stdout and "20 / 20 (100.0%)" in stdout


def test_a_run_the_quality_guard_stopped_is_failing(tmp_path, prompts_file):
    prompts, out = prompts_file(120), tmp_path / "out"
    with ServeProcess(["--echo-answer", ""]) as server:  # every answer empty: the guard stops the run
        summary = generate(_config(prompts, out, server.url, concurrency=4))
    assert summary.guard_tripped
    code, view, _ = run_status(out)
    assert (code, view["state"], view["writer_alive"]) == (1, "failing", False) and view["done"] < 120
    assert "quality guard" in view["shards"][0]["note"]
