"""SIGTERM stops every stage like Ctrl-C: one line on stderr, exit 143 (130 for Ctrl-C), no
traceback, the lock released, no worker left running, and the same command resumes. Real
`draftsmith` processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftsmith.serve.process import ServeProcess

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TERMINATED = "draftsmith: terminated (SIGTERM)"


def start(*args: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "draftsmith", *args], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stopped(process: subprocess.Popen, sig: int) -> str:
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    assert "Traceback" not in err, err
    return err


@pytest.mark.parametrize("sig,code,message", [(signal.SIGTERM, 143, TERMINATED), (signal.SIGINT, 130, "draftsmith: interrupted")])
def test_serve_stops_with_a_message_and_128_plus_the_signal(sig, code, message):
    process = start("serve", "--port", "0")
    try:
        assert "listening on" in process.stdout.readline()
        err = stopped(process, sig)
        assert process.returncode == code and err.strip().splitlines()[-1] == message
    finally:
        process.kill()
        process.wait()


def test_sigterm_to_tokenize_with_workers_stops_the_workers_and_the_run_resumes(tmp_path, tiny_target_dir):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(
        json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i} " * 20},
                                                {"role": "assistant", "content": f"answer {i} " * 40}]}) + "\n"
        for i in range(60_000)
    ))
    out = tmp_path / "tokenized"
    args = ("tokenize", str(rows), "--tokenizer", str(tiny_target_dir), "--out", str(out), "--workers", "2", "--no-progress", "--no-audit")
    process = start(*args)
    try:
        wait_for(lambda: len(children_of(process.pid)) >= 2 or process.poll() is not None, what="the workers")
        workers = children_of(process.pid)
        assert process.poll() is None and len(workers) >= 2
        time.sleep(1.0)  # the workers are busy with chunks
        err = stopped(process, signal.SIGTERM)
        assert process.returncode == 143, err
        assert err.strip().splitlines()[-1] == TERMINATED
        wait_for(lambda: not any(alive(pid) for pid in workers), timeout=10, what="the workers to exit")
    finally:
        if process.poll() is None:
            process.kill()
    # the lock went with the run: the same command resumes (not "already being written by pid ...")
    resumed = subprocess.run([sys.executable, "-m", "draftsmith", *args, "--resume"], env=ENV, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    from draftsmith.data.tokenized import read_shard

    ids = [i for path in sorted(out.glob("part-*.arrow")) for i in read_shard(path).column("id").to_pylist()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(60_000))


def test_sigterm_to_generate_keeps_every_row_and_the_run_resumes(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                               for i in range(60)))
    out = tmp_path / "out"
    with ServeProcess(["--backend", "echo", "--delay", "0.1"]) as server:
        args = ("generate", str(prompts), "-o", str(out), "-e", server.url, "--concurrency", "2", "--no-progress")
        process = start(*args)
        try:
            wait_for(lambda: any(p.stat().st_size for p in out.glob("generated-*.jsonl")) or process.poll() is not None,
                     what="the first rows")
            err = stopped(process, signal.SIGTERM)
            assert process.returncode == 143, err
            assert err.strip().splitlines()[-1] == TERMINATED
        finally:
            if process.poll() is None:
                process.kill()
        resumed = subprocess.run([sys.executable, "-m", "draftsmith", *args], env=ENV, capture_output=True, text=True,
                                 timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        assert "resuming:" in resumed.stderr
    rows = [json.loads(line) for path in out.glob("generated-*.jsonl") for line in path.read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == sorted(f"p{i}" for i in range(60))  # each exactly once
