"""SIGTERM and Ctrl-C stop `tokenize --workers 2` whole: a message, no worker left running (none
holding the output's lock), and a `--resume` that completes the output exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
from draftsmith.data.tokenized import read_shard
import pytest

from draftsmith.tiny import synthetic_conversations
from tokenize_helpers import write_jsonl

SRC = str(Path(__file__).resolve().parents[2] / "src")
ROWS = 6000


def children_of(pid: int) -> set[int]:
    """Pids whose parent is `pid` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def tokenize_command(source, tokenizer, out, *extra):
    return [sys.executable, "-m", "draftsmith", "tokenize", str(source), "-t", str(tokenizer), "-o", str(out),
            "--workers", "2", "--chunk-size", "8", "--rows-per-shard", "200", "--no-progress", "--no-audit", *extra]


def read_ids(out: Path) -> list[str]:
    shards = sorted(out.glob("part-*.arrow"))
    return pa.concat_tables([read_shard(shard) for shard in shards]).column("id").to_pylist() if shards else []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_every_worker_and_the_run_resumes_exactly(tmp_path, tiny_target_dir, signum):
    rows = list(synthetic_conversations(ROWS, seed=12))
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(tokenize_command(source, tiny_target_dir, out), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while not (out / "part-00001.arrow").exists():  # well under way: shards written, workers busy
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "tokenize wrote no shard in time"
            workers |= children_of(process.pid)
            time.sleep(0.05)
        workers |= children_of(process.pid)
        assert len(workers) >= 2
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in workers if alive(pid)] == [], "workers outlived the run"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in workers:  # what this test started; only if the code under test left them running
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == 128 + signum, stderr  # core.signals: 130 for Ctrl-C, 143 for SIGTERM
    assert "Traceback" not in stderr
    assert "tokenize: stopped" in stderr and "--resume" in stderr
    expected = "draftsmith: terminated (SIGTERM)" if signum == signal.SIGTERM else "draftsmith: interrupted"
    assert stderr.strip().splitlines()[-1] == expected
    kept = read_ids(out)
    assert 0 < len(kept) < ROWS

    # The lock is free and the run resumes where it stopped: every row exactly once.
    resumed = subprocess.run(tokenize_command(source, tiny_target_dir, out, "--resume"), env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "taking over the lock" not in resumed.stderr
    ids = read_ids(out)
    assert sorted(ids) == sorted(row["id"] for row in rows) and len(set(ids)) == ROWS
