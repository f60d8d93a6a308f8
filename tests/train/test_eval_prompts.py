"""`train --eval-prompts FILE --eval-every N`: real speculative decoding tau logged at eval points,
the best drafter kept, bad prompts refused before training (a real subprocess, as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.tiny import synthetic_prompts

SRC = Path(__file__).resolve().parents[2] / "src"


def train(target, data, out, *extra) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "draftsmith", "train", "--target", str(target), "--data", str(data), "--out", str(out),
               "--block-size", "8", "--draft-layers", "1", "--batch-size", "2", "--num-anchors", "16", "--dtype", "fp32",
               "--device", "cpu", "--threads", "1", "--no-progress", "--data-workers", "0", "--lr", "5e-3", "--warmup-ratio", "0",
               *map(str, extra)]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "held-out.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(3, seed=123)))
    return path


def test_eval_points_log_real_speculative_tau_and_keep_the_best_drafter(prompts, regenerated, tiny_target_dir, tmp_path):
    from draftsmith.model import load_drafter
    from draftsmith.model.speculative import default_stop_token_ids, speculative_decode
    from draftsmith.model.target import load_target_model
    from draftsmith.train.evaluation import encode_prompts

    out = tmp_path / "run"
    completed = train(tiny_target_dir, regenerated, out, "--max-steps", "12", "--log-every", "4", "--eval-prompts", prompts,
                      "--eval-every", "4", "--eval-max-new-tokens", "48")  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    evals = [record for record in records if "eval_tau" in record]
    assert [record["step"] for record in evals] == [4, 8, 12]
    assert all(record["eval_tau"] >= 1.0 and record["eval_cycles"] > 0 for record in evals)
    best = max(evals, key=lambda record: (record["eval_tau"], -record["step"]))
    summary = json.loads((out / "train_summary.json").read_text())
    assert (summary["extra"]["best_eval_tau"], summary["extra"]["best_eval_step"]) == (best["eval_tau"], best["step"])
    assert f"step {best['step']} eval: speculative tau" in completed.stderr

    # The logged number is what decoding the kept drafter-best gives, recomputed here.
    drafter = load_drafter(out / "drafter-best")
    target = load_target_model(tiny_target_dir, "cpu")
    tokens = cycles = 0
    with torch.no_grad():
        for ids in encode_prompts(prompts, tiny_target_dir, None, limit=8)[0]:
            result = speculative_decode(target, drafter, torch.tensor([ids]), 48, stop_token_ids=default_stop_token_ids(target))
            tokens, cycles = tokens + sum(result.acceptance_lengths), cycles + len(result.acceptance_lengths)
    assert tokens / cycles == pytest.approx(best["eval_tau"], rel=1e-9)
    assert (out / "drafter").is_dir()  # the final drafter is published as ever


def test_bad_eval_prompts_are_refused_before_training(regenerated, tiny_target_dir, tmp_path):
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"id": "x", "messages": [{"role": "robot", "content": "Hi"}]}\n')
    completed = train(tiny_target_dir, regenerated, tmp_path / "run", "--max-steps", "2", "--eval-prompts", bad)
    assert completed.returncode == 2, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("draftsmith: error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"draftsmith: error: {bad}:1: messages[0]: unknown speaker 'robot'"), errors
    assert "Traceback" not in completed.stderr and not (tmp_path / "run" / "train_log.jsonl").exists()


def test_a_resume_keeps_a_published_best_newer_than_its_checkpoint(prompts, regenerated, tiny_target_dir, tmp_path):
    # drafter-best is published before the checkpoint of its step; a run resumed from an older
    # checkpoint restored that checkpoint's best tau, and a later, worse eval replaced the better
    # drafter on disk. The best on disk (its record.json) now counts too.
    import shutil

    out = tmp_path / "run"
    args = ("--max-steps", "12", "--eval-prompts", prompts, "--eval-every", "4", "--eval-max-new-tokens", "24",
            "--save-every", "4", "--keep-checkpoints", "5")  # fmt: skip
    assert (completed := train(tiny_target_dir, regenerated, out, *args)).returncode == 0, completed.stderr[-3000:]
    record = out / "drafter-best" / "record.json"
    written = json.loads(record.read_text())
    assert set(written) == {"eval_tau", "step"} and written["step"] in (4, 8, 12)
    # As if the run had reached a better drafter at step 8 and stopped before checkpointing it:
    record.write_text(json.dumps({"eval_tau": 99.0, "step": 8}))
    weights = (out / "drafter-best" / "model.safetensors").read_bytes()
    for checkpoint in (out / "checkpoints").iterdir():
        if checkpoint.name != "step-00000004":
            shutil.rmtree(checkpoint)
    resumed = train(tiny_target_dir, regenerated, out, *args, "--resume")
    assert resumed.returncode == 0 and "resuming at step 4" in resumed.stderr, resumed.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert (summary["extra"]["best_eval_tau"], summary["extra"]["best_eval_step"]) == (99.0, 8)
    assert (out / "drafter-best" / "model.safetensors").read_bytes() == weights
    assert json.loads(record.read_text()) == {"eval_tau": 99.0, "step": 8}
