"""`draftsmith demo --target`: tiny or a model `draftsmith models` knows, refused before any work."""

from __future__ import annotations

import os
import subprocess
import sys


def test_an_unknown_target_is_one_line_and_touches_nothing(tmp_path):
    result = subprocess.run([sys.executable, "-m", "draftsmith", "demo", "--target", "nope", "--workdir",
                             str(tmp_path / "demo")], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": "src"})
    assert result.returncode == 2
    assert result.stderr.strip() == "draftsmith: error: --target unknown target 'nope'; known: tiny, smollm2-135m"
    assert not (tmp_path / "demo").exists()


def test_a_real_target_gets_its_own_sizes_where_unset_and_a_given_flag_wins():
    from draftsmith.demo.config import REAL_TARGET_DEFAULTS, DemoConfig

    tiny = DemoConfig()
    real = DemoConfig(target="smollm2-135m", train_steps=9)
    assert (tiny.train_prompts, tiny.block_size, tiny.train_steps) == (320, 16, 240)
    for name, value in REAL_TARGET_DEFAULTS.items():
        assert getattr(real, name) == (9 if name == "train_steps" else value), name
    assert tiny.resolved_train_dtype(cuda=False) == "fp32"
    assert DemoConfig(target="smollm2-135m", train_dtype="fp32").resolved_train_dtype(cuda=True) == "fp32"
    assert real.resolved_train_dtype(cuda=True) == "bf16"
