"""Output-directory locks, with real second processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.core.lock import LOCK_NAME, DirectoryLock, lock_directory
from draftsmith.serve.process import ServeProcess

SRC = str(Path(__file__).resolve().parents[2] / "src")

HOLDER = """
import sys, time
from draftsmith.core.lock import DirectoryLock
lock = DirectoryLock(sys.argv[1], "test holder").acquire()
print("locked", flush=True)
if sys.argv[2] == "crash":
    import os; os._exit(0)  # dies holding the lock: no release, its pid stays in the file
time.sleep(60)
"""


def _holder(directory: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC}
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), mode], stdout=subprocess.PIPE, env=env, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


def test_a_second_writer_in_another_process_is_refused(tmp_path):
    holder = _holder(tmp_path / "out", "hold")
    try:
        with pytest.raises(InputError) as refused:
            DirectoryLock(tmp_path / "out", "test second").acquire()
        message = str(refused.value)
        assert f"pid {holder.pid} on" in message and "test holder" in message and "\n" not in message
    finally:
        holder.kill()
        holder.wait()
    messages: list[str] = []
    with lock_directory(tmp_path / "out", "test after", log=messages.append):
        pass  # the kernel released the killed holder's lock
    assert messages and f"pid {holder.pid}" in messages[0] and "taking over" in messages[0]


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    crashed = _holder(tmp_path / "out", "crash")
    crashed.wait()
    assert (tmp_path / "out" / LOCK_NAME).read_text().split()[0] == str(crashed.pid)
    messages: list[str] = []
    with lock_directory(tmp_path / "out", "test next", log=messages.append):
        assert (tmp_path / "out" / LOCK_NAME).read_text().split()[0] == str(os.getpid())
    assert messages == [messages[0]] and f"dead pid {crashed.pid}" in messages[0]
    # released cleanly: the next run takes it without a word
    with lock_directory(tmp_path / "out", "test again", log=messages.append):
        pass
    assert len(messages) == 1


def test_two_generate_runs_on_one_directory_do_not_both_write(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                               for i in range(40)))
    out = tmp_path / "out"
    with ServeProcess(["--backend", "echo", "--delay", "0.2"]) as server:
        env = {**os.environ, "PYTHONPATH": SRC}
        first = subprocess.Popen(
            [sys.executable, "-m", "draftsmith", "generate", str(prompts), "-o", str(out), "-e", server.url,
             "--concurrency", "1", "--no-progress"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not list(out.glob("generated-*.jsonl")) and time.monotonic() < deadline:
                time.sleep(0.1)  # the first run holds the lock once it writes rows
            assert first.poll() is None, first.stderr.read()
            code = main(["generate", str(prompts), "-o", str(out), "-e", server.url, "--no-progress"])
            err = capsys.readouterr().err
            assert code == 2 and f"already being written by pid {first.pid}" in err
            assert first.wait(timeout=120) == 0
        finally:
            if first.poll() is None:
                first.kill()
    rows = [json.loads(line) for path in out.glob("generated-*.jsonl") for line in path.read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == sorted(f"p{i}" for i in range(40))  # each exactly once
