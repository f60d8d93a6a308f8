from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


SRC = Path(__file__).resolve().parents[2] / "src"


def environment() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="120", OMP_NUM_THREADS="1")


@pytest.fixture
def prompts_seed() -> int:
    return 5


def start_generate(prompts: Path, out: Path, url: str, *args: str) -> subprocess.Popen:
    """`draftsmith generate` as a real process (so a test can kill -9 it)."""
    command = [sys.executable, "-m", "draftsmith", "generate", str(prompts), "-o", str(out), "-e", url, "--no-progress",
               "--backoff-base-s", "0.02", "--health-interval", "0.3", *args]  # fmt: skip
    return subprocess.Popen(command, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run_status(*args: str | Path) -> tuple[int, dict | None, str]:
    """`draftsmith status --json ...` as a real process: (exit code, the JSON object or None, stderr)."""
    result = subprocess.run([sys.executable, "-m", "draftsmith", "status", "--json", *map(str, args)],
                            capture_output=True, text=True, env=environment(), timeout=60)  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else None, result.stderr


def row_count(directory: Path) -> int:
    """Complete rows on disk, counted the slow, obvious way."""
    return sum(text.count("\n") for text in (p.read_text() for p in Path(directory).glob("generated-*.jsonl")))


def wait_for_rows(directory: Path, count: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while row_count(directory) < count:
        assert time.monotonic() < deadline, f"fewer than {count} rows after {timeout}s"
        time.sleep(0.1)
