"""`draftsmith demo --target smollm2-135m` with its defaults, as a newcomer runs it (issue 24's
"done when"): every stage on the real model, in a few CPU minutes, and a drafter that learned."""

from __future__ import annotations

import json


def test_the_real_target_demo_runs_on_its_defaults_and_its_drafter_beats_the_untrained_one(smollm2, tmp_path):
    from draftsmith.demo import DemoConfig, run_demo

    lines: list[str] = []
    result = run_demo(DemoConfig(target="smollm2-135m", workdir=tmp_path / "demo", threads=1), log=lines.append)
    assert result.generated == 64 and result.train_steps == 150
    assert result.audit_verdict.startswith("PASS"), result.audit_verdict
    assert result.lossless
    # Training on the target's own answers must show: 1.16 against 1.00 on this machine.
    assert result.tau_trained > result.tau_untrained + 0.05, (result.tau_trained, result.tau_untrained)
    config = json.loads((tmp_path / "demo" / "export" / "config.json").read_text())
    assert config["block_size"] == 8 and config["num_hidden_layers"] == 1
