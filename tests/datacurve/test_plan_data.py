"""`draftsmith plan data` end to end on the tiny target, CI-sized: nested subsets trained and measured
by real speculative decoding, the curve fitted, joined to the plan, written as table, JSON and plot;
a rerun reuses every finished subset; bad input is one line and exit 2 before any training."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

from draftsmith.tiny import synthetic_prompts  # noqa: E402
from regenerate import regenerate_locally  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
TRAINING_SEED = 21


@pytest.fixture(scope="module")
def curve_inputs(tmp_path_factory, tiny_target_dir):
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("plan-data")
    regenerate_locally(tiny_target_dir, synthetic_prompts(32, seed=TRAINING_SEED), root / "tokenized",
                       max_new_tokens=64, batch_size=32)
    held_out = root / "held_out.jsonl"
    held_out.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(3, seed=TRAINING_SEED + 500)))
    return root, root / "tokenized", held_out


def _plan_data(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "draftsmith", "plan", "data", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def _recipe(target: Path, data: Path, held_out: Path, out: Path, sizes: str = "8,16,32") -> list[str]:
    return ["--target", str(target), "--data", str(data), "--eval-prompts", str(held_out), "--out", str(out),
            "--sizes", sizes, "--epochs", "2", "--draft-layers", "1", "--block-size", "4", "--lr", "3e-3",
            "--num-anchors", "16", "--max-length", "256", "--eval-max-new-tokens", "24", "--data-workers", "0",
            "--bootstrap", "40", "--samples", "914k", "--target-tau", "1.5", "--per-gpu", "400 tok/s", "--gpus", "4"]


def test_plan_data_measures_fits_and_plans_and_a_rerun_reuses_every_subset(curve_inputs, tiny_target_dir):
    root, data, held_out = curve_inputs
    out = root / "curve"
    first = _plan_data([*_recipe(tiny_target_dir, data, held_out, out), "--json"], root)
    assert first.returncode in (0, 1), first.stderr[-3000:]
    result = json.loads(first.stdout)
    assert result["kind"] == "draftsmith.plan.data"
    # Fixed epochs: the steps double with the subset, and the output says so.
    assert [(row["size"], row["steps"]) for row in result["rows"]] == [(8, 16), (16, 32), (32, 64)]
    assert "steps grow with the subset: 16, 32, 64" in first.stderr
    assert all(row["lossless"] and len(row["tau"]) == 1 for row in result["rows"])
    assert all(1.0 <= row["tau"][0] <= 4.0 for row in result["rows"])
    assert set(result["baselines"]) == {"ngram", "untrained"}
    # Three sizes: both methods were judged on the largest one from the two smaller ones.
    assert {check["method"] for check in result["method_checks"]} == {"tau", "positions"}
    assert result["method"] in ("tau", "positions") and result["method"] in result["method_reason"]
    plan = {row["label"]: row for row in result["plan"]}
    planned = plan["planned (--samples)"]
    assert planned["n"] == 914_000 and planned["extrapolated"] and not planned["supported"]  # 32 * 4 = 128 is the limit
    assert planned["low"] <= planned["tau"] <= planned["high"]
    # Regeneration at 4 x 400 tok/s of the data's mean completion, as `plan` computes it.
    assert planned["regeneration_days"] == pytest.approx(914_000 * result["output_mean"] / 1600 / 86400, rel=1e-6)
    assert planned["regeneration_gpus"] == 4 and planned["train_gpu_hours"] > 0
    assert result["smoke"]["bars"].keys() == {"ngram", "untrained"} and isinstance(result["smoke"]["passed"], bool)
    assert (out / "curve.json").is_file() and (out / "curve.png").stat().st_size > 0
    for size in (8, 16, 32):  # ordinary train run directories, one per subset
        assert (out / "runs" / f"n{size}-seed0" / "drafter").is_dir()
        assert (out / "runs" / f"n{size}-seed0" / "curve_eval.json").is_file()

    again = _plan_data(_recipe(tiny_target_dir, data, held_out, out), root)
    assert again.returncode in (0, 1), again.stderr[-3000:]
    assert again.stderr.count("reused") == 3 and "training" not in again.stderr.split("reused")[-1]
    assert "914,000" in again.stdout and "extrapolation rule" in again.stdout


    # `draftsmith status` reads the curve: every run measured, the steps of all of them done.
    code, view = _status(out)
    assert code == 0 and view["stage"] == "plan data" and view["state"] == "finished", view
    assert view["done"] == view["total"] == 16 + 32 + 64
    assert view["curve"]["runs_measured"] == view["curve"]["runs_total"] == 3 and view["curve"]["method"] == result["method"]
    assert [(shard["name"], shard["state"], shard["total"]) for shard in view["shards"]] == [
        ("n=8 seed 0", "finished", 16), ("n=16 seed 0", "finished", 32), ("n=32 seed 0", "finished", 64)]
    # What a kill during the last run's measurement leaves: trained, not measured, no curve.
    killed = root / "killed-curve"
    shutil.copytree(out, killed)
    (killed / "curve.json").unlink()
    (killed / "runs" / "n32-seed0" / "curve_eval.json").unlink()
    code, view = _status(killed)
    assert code == 1 and view["state"] == "dead" and view["curve"]["runs_measured"] == 2, view
    assert [shard["state"] for shard in view["shards"]] == ["finished", "finished", "dead"]
    assert any("rerun it: finished runs are reused" in alert for alert in view["alerts"]), view["alerts"]


def _status(out: Path) -> tuple[int, dict]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    completed = subprocess.run([sys.executable, "-m", "draftsmith", "status", "--json", str(out)], env=env,
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "Traceback" not in completed.stderr, completed.stderr
    return completed.returncode, json.loads(completed.stdout)


@pytest.mark.parametrize("sizes, change, message", [
    ("16,8", [], "strictly increasing"),
    ("8,8", [], "strictly increasing"),
    ("8,64", [], "more than the data holds"),
    ("1,8", ["--batch-size", "2"], "smaller than one optimizer step"),
    ("8,16", ["--target-tau", "5"], "above what a block of 4 can reach"),
    ("8,16", ["--max-steps", "10"], "--max-steps is not a curve setting"),
])
def test_bad_curve_settings_are_one_line_and_exit_2_before_any_training(curve_inputs, tiny_target_dir, sizes, change, message):
    root, data, held_out = curve_inputs
    out = root / f"bad-{abs(hash((sizes, *change)))}"
    result = _plan_data([*_recipe(tiny_target_dir, data, held_out, out, sizes), *change], root)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (out / "runs").exists()


def test_held_out_prompts_that_are_training_samples_are_refused(curve_inputs, tiny_target_dir):
    root, data, _ = curve_inputs
    leaked = root / "leaked.jsonl"
    leaked.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(3, seed=TRAINING_SEED)))
    result = _plan_data(_recipe(tiny_target_dir, data, leaked, root / "leaked-curve"), root)
    assert result.returncode == 2
    assert "3 of 3 held-out prompts are training samples" in result.stderr
