"""`draftsmith train` under torchrun with two gloo ranks on the CPU, as the tests run it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def torchrun_train(train_args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run `torchrun --nproc_per_node 2 -m draftsmith train ...`; a hang fails the test, leaving no process."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "draftsmith", "train", *train_args]  # fmt: skip
    # Own session, so a hang cannot leave torchrun's worker processes behind.
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"torchrun did not finish in {timeout:g} s:\n" + stdout[-2000:] + stderr[-2000:])
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
