"""`check --overfit` without an engine: it trains and exports the gate's drafter, measures the
in-process tau, prints how to serve it, and is judged only once --endpoint names that server (the
engine half runs in tests/engines/test_check_overfit.py)."""

from __future__ import annotations

import json

from draftsmith.cli import main


def test_overfit_prepares_the_gate_and_says_how_to_serve_it(good_export, tiny_target_dir, tmp_path, capsys):
    work = tmp_path / "gate"
    base = ["check", str(good_export), "--target", str(tiny_target_dir), "--no-parity", "--overfit",
            "--overfit-samples", "4", "--overfit-steps", "20", "--overfit-max-new-tokens", "24", "--json"]
    args = [*base, "--overfit-dir", str(work)]
    assert main(args) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # training logs went to stderr: stdout is the report alone
    gate = report["overfit"]
    assert gate["passed"] is None and gate["verdict"].startswith("not judged yet: in-process tau ")
    assert f'"model": "{(work / "export").resolve()}", "num_speculative_tokens": 15' in gate["serve_command"]
    assert (work / "overfit.json").is_file() and (work / "export" / "config.json").is_file()
    assert "overfit" in report["checks"]

    assert main(args) == 0  # same settings: the gate's drafter is reused, not retrained
    assert "reusing" in capsys.readouterr().err

    assert main(["check", str(good_export), "--target", str(tiny_target_dir), "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "pass --overfit with it" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main([*base, "--overfit-dir", str(tmp_path / "other")]) == 2
    assert "not an overfit-gate directory" in capsys.readouterr().err
