"""The main job end to end on the tiny default: every stage runs for real, at toy scale."""

import json

import pytest

from draftsmith.cli import main
from draftsmith.demo import DemoConfig, run_demo
from draftsmith.core.errors import InputError


@pytest.mark.slow
def test_demo_trains_a_drafter_that_beats_an_untrained_one(small_demo):
    from pathlib import Path

    result = small_demo
    workdir = Path(result.export_dir).parent
    assert result.generated == 160
    assert result.audit_verdict.startswith("PASS")
    assert result.plan_days_for_914k > 0
    assert result.train_final_loss < result.train_first_loss / 2
    assert result.lossless
    assert result.tau_untrained < 1.2
    assert result.tau_trained > 1.5 and result.tau_trained > result.tau_untrained + 0.4
    saved = json.loads((workdir / "demo_result.json").read_text())
    assert saved["tau_trained"] == result.tau_trained
    assert (workdir / "export" / "config.json").exists()


def test_demo_refuses_to_replace_a_directory_it_did_not_make(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(InputError, match="not a demo directory"):
        run_demo(DemoConfig(workdir=tmp_path), log=lambda message: None)
    assert main(["demo", "--workdir", str(tmp_path)]) == 2
    assert "not a demo directory" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "keep me"
