"""benchmarks/gpu_check.sh: refuses plainly without a GPU, and its every step runs (small) on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_without_a_cuda_device_it_says_so_and_exits_2():
    result = _run(timeout=300)
    assert result.returncode == 2, result.stderr
    assert "gpu_check: no CUDA device here" in result.stderr and result.stdout == ""


@pytest.mark.slow
def test_cpu_smoke_runs_every_row(tmp_path):
    result = _run("--cpu-smoke", "--work-dir", str(tmp_path), timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split("  ")[0].strip(): line for line in result.stdout.splitlines()[2:]}
    for check in ("attention dense", "attention sparse", "train fp32 online", "train fsdp (1 rank)", "eval cpu"):
        assert " ok " in rows[check], rows.get(check, result.stdout)
    assert "skipped" in rows["attention flex"]  # no FlexAttention backward on the CPU
    assert "lossless True" in rows["eval cpu"]
