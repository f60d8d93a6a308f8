"""`draftsmith status` on a real `draftsmith train` process: running, then killed (dead), and a
finished run with its eval tau, drafter-best and checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from draftsmith.tiny import synthetic_prompts

from .conftest import environment, run_status

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from regenerate import regenerate_locally  # noqa: E402


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, tiny_target_dir) -> Path:
    out = tmp_path_factory.mktemp("status-train") / "tokenized"
    torch.set_num_threads(1)
    regenerate_locally(tiny_target_dir, synthetic_prompts(16, seed=11), out, max_new_tokens=64, batch_size=16)
    return out


def _train(target, data, out, *extra) -> list[str]:
    return [sys.executable, "-m", "draftsmith", "train", "--target", str(target), "--data", str(data), "--out", str(out),
            "--block-size", "8", "--draft-layers", "1", "--batch-size", "2", "--num-anchors", "16", "--dtype", "fp32",
            "--device", "cpu", "--threads", "1", "--no-progress", "--data-workers", "0", "--log-every", "1",
            *map(str, extra)]  # fmt: skip


def _log_steps(out: Path) -> int:
    path = out / "train_log.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_running_train_then_killed_is_dead(tokenized, tiny_target_dir, tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen(_train(tiny_target_dir, tokenized, out, "--max-steps", "100000", "--epochs", "1000"),
                               env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while _log_steps(out) < 3:
            assert process.poll() is None, process.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        code, running, _ = run_status(out)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        process.kill()
        process.wait()
    logged_total = json.loads((out / "train_log.jsonl").read_text().splitlines()[0])["total_steps"]
    assert (code, running["stage"], running["state"], running["writer_alive"]) == (0, "train", "running", True)
    assert running["total"] == logged_total > running["done"]  # the steps the trainer planned (epochs x batches)
    train = running["train"]
    assert running["done"] >= 3 and train["loss"] > 0 and train["tokens_per_s"] > 0 and running["rows_per_s"] > 0
    assert running["eta_s"] > 0
    code, dead, _ = run_status(out)
    assert (code, dead["state"], dead["writer_alive"]) == (1, "dead", False)


def test_a_finished_train_shows_eval_tau_best_and_checkpoint(tokenized, tiny_target_dir, tmp_path):
    out, prompts = tmp_path / "run", tmp_path / "held-out.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(2, seed=123)))
    completed = subprocess.run(_train(tiny_target_dir, tokenized, out, "--max-steps", "6", "--eval-prompts", prompts,
                                      "--eval-every", "3", "--eval-max-new-tokens", "24", "--save-every", "3"),
                               env=environment(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    code, view, _ = run_status(out)
    record = json.loads((out / "drafter-best" / "record.json").read_text())
    assert (code, view["state"], view["done"], view["total"], view["eta_s"]) == (0, "finished", 6, 6, 0)
    train = view["train"]
    assert train["last_eval"]["step"] == 6 and train["last_eval"]["eval_tau"] >= 1
    assert train["drafter_best"] == {"step": record["step"], "eval_tau": record["eval_tau"]}
    assert train["checkpoint"]["step"] == 6 and train["checkpoint"]["age_s"] >= 0


def test_a_run_stopped_by_max_minutes_is_finished_with_its_reason_and_exit_0(tokenized, tiny_target_dir, tmp_path):
    """It stopped as it was asked to: `dead` and exit 1 paged the README's cron line for every budgeted
    run (issue 34 item 3). A resume that then dies is dead again."""
    out = tmp_path / "run"
    completed = subprocess.run(_train(tiny_target_dir, tokenized, out, "--max-steps", "40", "--log-every", "2",
                                      "--max-minutes", "2e-5"),
                               env=environment(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert completed.returncode == 0 and "stopped by --max-minutes" in completed.stderr, completed.stderr[-3000:]
    code, view, _ = run_status(out)
    assert (code, view["state"], view["done"], view["total"], view["eta_s"], view["alerts"]) == (0, "finished", 2, 40, 0, [])
    assert view["train"]["stopped"].startswith("stopped by --max-minutes at step 2")
    assert view["shards"][0]["note"] == view["train"]["stopped"]
    # A later run logged past the summary's step and left no summary of its own: killed, so dead.
    with (out / "train_log.jsonl").open("a") as log:
        log.write(json.dumps({"step": 4, "loss": 1.0, "total_steps": 40}) + "\n")
    code, view, _ = run_status(out)
    assert (code, view["state"], view["train"]["stopped"]) == (1, "dead", None)
