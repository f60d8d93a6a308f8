"""The first Ctrl-C or SIGTERM stops `generate` wherever it waits, even inside open() of a FIFO."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")


def blocked_in_fifo_open(pid: int) -> bool | None:
    """Whether a thread of `pid` sleeps in the kernel's FIFO open, where a reader waits for a writer
    (None where the kernel hides where threads sleep)."""
    places = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            places.add((task / "wchan").read_text().strip())
        except OSError:
            continue
    if places <= {"", "0"}:
        return None
    return bool(places & {"wait_for_partner", "fifo_open"})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_run_blocked_opening_a_fifo_nobody_writes(tmp_path, signum):
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "draftsmith", "generate", str(fifo), "-o", str(out),
               "-e", "http://127.0.0.1:9", "--no-progress"]  # fmt: skip
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        # The lock is taken just before the prompts are read; then wait until open() is blocked.
        while not (out / ".draftsmith.s0of1.lock").exists() or blocked_in_fifo_open(process.pid) is False:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "generate never reached the FIFO"
            time.sleep(0.05)
        time.sleep(0.2 if blocked_in_fifo_open(process.pid) else 2.0)
        process.send_signal(signum)
        try:
            stdout, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the first {signal.Signals(signum).name} did not stop generate blocked on a FIFO")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signum, stderr
    assert "Traceback" not in stderr
    expected = "draftsmith: terminated (SIGTERM)" if signum == signal.SIGTERM else "draftsmith: interrupted"
    assert stderr.strip().splitlines()[-1] == expected
    assert stdout == ""


def test_prompts_from_a_fifo_still_work(tmp_path):
    """Reading in a thread keeps what worked: `generate <(cat prompts.jsonl)` is a pipe too."""
    from draftsmith.serve.process import ServeProcess

    from .conftest import read_rows

    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    rows = "".join(f'{{"id": "p{i}", "messages": [{{"role": "user", "content": "q{i}"}}]}}\n' for i in range(5))
    with ServeProcess() as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "draftsmith", "generate", str(fifo), "-o", str(tmp_path / "out"), "-e", server.url,
             "--no-progress"], env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            with open(fifo, "w") as writer:  # blocks until generate opens its end
                writer.write(rows)
            stdout, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0, stderr
    assert sorted(row["id"] for row in read_rows(tmp_path / "out")) == [f"p{i}" for i in range(5)]
