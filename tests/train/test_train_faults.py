"""Silent training faults made loud: a resume of a finished run keeps its summary (no null tau, no
"tau ~nan"), and a flag of another drafter variant or loss is refused in one line on every path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from draftsmith.cli import main
from draftsmith.train import TrainConfig, train_drafter
from test_training import small_config


def test_resuming_a_finished_run_keeps_its_summary_and_says_so(regenerated, tiny_target_dir, tmp_path, capsys):
    out = tmp_path / "run"
    config = small_config(tiny_target_dir, regenerated, out, max_steps=2)
    first = train_drafter(config)
    summary = (out / "train_summary.json").read_bytes()
    log = (out / "train_log.jsonl").read_bytes()
    assert json.loads(summary)["train_tau"] is not None
    capsys.readouterr()

    again = train_drafter(config.model_copy(update={"resume": True}))
    err = capsys.readouterr().err
    assert f"train: the run in {out} already finished (step 2 of 2); nothing to resume" in err, err
    assert (out / "train_summary.json").read_bytes() == summary and (out / "train_log.jsonl").read_bytes() == log
    assert again.extra["already_finished"] and again.train_tau == pytest.approx(first.train_tau)
    assert again.accuracy_by_offset == pytest.approx(first.accuracy_by_offset)

    flags = ["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(out), "--resume",
             "--block-size", "8", "--draft-layers", "1", "--epochs", "1", "--lr", "2e-3", "--warmup-ratio", "0",
             "--batch-size", "4", "--dtype", "fp32", "--device", "cpu", "--threads", "1", "--no-progress",
             "--log-every", "1", "--num-anchors", "24", "--max-steps", "2"]
    assert main(flags) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("already finished: 2 steps") and "nan" not in captured.out, captured.out
    assert (out / "train_summary.json").read_bytes() == summary


def test_a_finished_run_without_its_summary_reports_the_logged_metrics(regenerated, tiny_target_dir, tmp_path):
    out = tmp_path / "run"
    config = small_config(tiny_target_dir, regenerated, out, max_steps=2)
    first = train_drafter(config)
    (out / "train_summary.json").unlink()  # killed after its last checkpoint, before the summary
    again = train_drafter(config.model_copy(update={"resume": True}))
    written = json.loads((out / "train_summary.json").read_text())
    assert written["train_tau"] == pytest.approx(first.train_tau) and written["accuracy_by_offset"]
    assert again.train_tau == pytest.approx(first.train_tau)


FOREIGN = [
    (("--markov-rank", "8"), "--markov-rank is a setting of --drafter dspark, and this run trains with --drafter dflash"),
    (("--no-confidence-head",), "--confidence-head is a setting of --drafter dspark"),
    (("--dpace-alpha", "0.3"), "--dpace-alpha is a setting of --loss-weights dpace, and this run trains with "
                               "--loss-weights decay"),
    (("--loss-weights", "dpace", "--gamma", "4"), "--gamma is a setting of --loss-weights decay, and this run trains "
                                                  "with --loss-weights dpace"),
]


@pytest.mark.parametrize("flags, named", FOREIGN)
def test_a_flag_of_another_variant_or_loss_is_refused_in_one_line(flags, named, regenerated, tiny_target_dir, tmp_path,
                                                                  capsys):
    code = main(["train", "--target", str(tiny_target_dir), "--data", str(regenerated), "--out", str(tmp_path / "o"),
                 *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and named in err[0], err
    assert not (tmp_path / "o").exists()


def test_the_same_refusal_holds_for_a_config_file_and_the_python_api(regenerated, tiny_target_dir, tmp_path, capsys):
    file = tmp_path / "train.json"
    file.write_text(json.dumps({"target": str(tiny_target_dir), "data": str(regenerated), "out": str(tmp_path / "o"),
                                "dpace-alpha": 0.3}))
    assert main(["train", "--config", str(file)]) == 2
    assert "--dpace-alpha is a setting of --loss-weights dpace" in capsys.readouterr().err
    with pytest.raises(ValidationError, match="--markov-rank is a setting of --drafter dspark"):
        TrainConfig(target=tiny_target_dir, data=regenerated, out=tmp_path / "o", markov_rank=8)
    # What the chosen variant and loss read stays accepted.
    TrainConfig(target=tiny_target_dir, data=regenerated, out=tmp_path / "o", drafter="dspark", markov_rank=8,
                confidence_head=False, loss_weights="dpace", dpace_alpha=0.3)
    TrainConfig(target=tiny_target_dir, data=regenerated, out=tmp_path / "o", gamma=4.0)
