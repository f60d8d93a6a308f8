"""`train --report-to tensorboard` read back from its event file; `train --benchmark-steps` read by `plan --train`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from draftsmith.cli import main
from draftsmith.plan.training import make_train_plan
from draftsmith.tiny import synthetic_prompts
from draftsmith.train import TrainConfig, train_drafter
from regenerate import regenerate_locally


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, tiny_target_dir) -> Path:
    out = tmp_path_factory.mktemp("reporting") / "tokenized"
    torch.set_num_threads(1)
    regenerate_locally(tiny_target_dir, synthetic_prompts(12, seed=5), out, max_new_tokens=48, batch_size=12)
    return out


def _config(target: Path, data: Path, out: Path, **overrides) -> TrainConfig:
    settings = dict(target=target, data=data, out=out, block_size=8, num_draft_layers=1, epochs=1, lr=2e-3,
                    warmup_ratio=0.0, batch_size=4, dtype="fp32", device="cpu", num_threads=1, progress=False,
                    log_every=1, num_anchors=16)
    settings.update(overrides)
    return TrainConfig(**settings)


def test_tensorboard_scalars_match_the_train_log(tokenized, tiny_target_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    train_drafter(_config(tiny_target_dir, tokenized, out, report_to="tensorboard"))
    events = list((out / "runs").rglob("events.out.tfevents.*"))
    assert len(events) == 1
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    expected = {"train/loss", "train/learning_rate", "train/grad_norm", "train/epoch", "train/tokens_per_s", "train/tau",
                "train/anchor_coverage"}
    expected |= {f"train/acc_offset_{k}" for k in range(1, 8)}
    assert tags == expected
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    loss = accumulator.Scalars("train/loss")
    assert [event.step for event in loss] == [1, 2, 3]
    assert [event.value for event in loss] == pytest.approx([r["loss"] for r in records], rel=1e-6)
    tau = accumulator.Scalars("train/tau")
    assert [event.value for event in tau] == pytest.approx([r["train_tau"] for r in records], rel=1e-6)
    acc = accumulator.Scalars("train/acc_offset_3")
    assert [event.value for event in acc] == pytest.approx([r["acc_by_offset"][2] for r in records], rel=1e-6)
    assert accumulator.Scalars("train/learning_rate")[0].value == pytest.approx(records[0]["lr"])


def test_report_to_errors_exit_2_before_loading_anything(tokenized, tiny_target_dir, tmp_path, capsys):
    base = ["train", "--target", str(tiny_target_dir), "--data", str(tokenized), "--out", str(tmp_path / "x")]
    assert main(base + ["--report-to", "mlflow"]) == 2
    assert "--report-to: Input should be 'none', 'tensorboard' or 'wandb'" in capsys.readouterr().err
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here; the missing-package error cannot be shown")
    assert main(base + ["--report-to", "wandb"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the wandb package" in err
    assert not (tmp_path / "x").exists()


def test_benchmark_steps_write_a_file_plan_reads(tokenized, tiny_target_dir, tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["train", "--target", str(tiny_target_dir), "--data", str(tokenized), "--out", str(out),
                 "--block-size", "8", "--draft-layers", "1", "--num-anchors", "16", "--batch-size", "2",
                 "--dtype", "fp32", "--device", "cpu", "--threads", "1", "--benchmark-steps", "3"])
    assert code == 0
    assert "3 steps in" in capsys.readouterr().out
    data = json.loads((out / "train_benchmark.json").read_text())
    assert data["kind"] == "draftsmith.train_benchmark" and data["mode"] == "online"
    assert data["steps"] == 3 and data["warmup_steps"] == 2 and data["world_size"] == 1
    assert data["samples_per_s"] == pytest.approx(3 * 2 / data["seconds"])
    assert data["steps_per_s"] == pytest.approx(3 / data["seconds"])
    assert data["tokens_per_s"] == pytest.approx(data["samples_per_s"] * data["mean_tokens_per_sample"])
    assert 20 < data["mean_tokens_per_sample"] < 200 and data["peak_memory_bytes"] > 10**7
    assert data["shapes"]["block_size"] == 8 and data["shapes"]["batch_size"] == 2
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".draftsmith")) == ["train_benchmark.json"]  # no checkpoint, drafter or log

    plan = make_train_plan(dict(samples=1000, mean_length=data["mean_tokens_per_sample"], max_length=256, epochs=2,
                                num_anchors=16, block_size=8, draft_layers=1, num_features=4, batch_size=2, gpus=3,
                                model_config_path=str(tiny_target_dir), train_bench=str(out / "train_benchmark.json")))
    assert plan.headline.source == "train-bench"
    assert plan.headline.wall_time.seconds == pytest.approx(1000 * 2 * data["mean_tokens_per_sample"] / (data["tokens_per_s"] * 3))
    # A CPU benchmark planning a run on GPUs (H100, the default) is said to be one, and nothing else is wrong.
    assert len(plan.warnings) == 1 and "the train benchmark ran on cpu (1 threads), but this plans a run on H100" in plan.warnings[0]
