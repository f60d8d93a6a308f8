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
