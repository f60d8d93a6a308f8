"""Optional features (plots, tensorboard) live in extras: a missing one is refused before any work,
in one line that names the extra to install."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HIDE = "import sys; sys.modules['matplotlib'] = None; from draftsmith.cli import main; sys.exit(main({argv!r}))"


def _run_without_matplotlib(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE.format(argv=argv)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stage", ["audit", "eval"])
def test_plot_without_matplotlib_is_refused_before_any_work(tmp_path, stage):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}) + "\n")
    plot = tmp_path / "plot.png"
    argv = {
        "audit": ["audit", str(rows), "--plot", str(plot)],
        # The target and drafter do not exist: the missing extra must be said before they are looked for.
        "eval": ["eval", "--target", str(tmp_path / "t"), "--drafter", str(tmp_path / "d"), "--prompts", str(rows),
                 "--plot", str(plot)],
    }[stage]  # fmt: skip
    result = _run_without_matplotlib(argv)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "draftsmith: error: --plot needs the matplotlib package, which is not installed: pip install 'draftsmith[plot]'"
    )
    assert result.stdout == "" and not plot.exists()


def test_the_declared_extras_hold_the_optional_packages():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    required = " ".join(project["dependencies"])
    for optional in ("matplotlib", "tensorboard", "wandb", "httpx"):
        assert optional not in required
    extras = project["optional-dependencies"]
    assert extras["plot"] == ["matplotlib>=3.8"] and extras["tensorboard"] and extras["wandb"]
    torch = next(item for item in project["dependencies"] if item.startswith("torch"))
    assert "==" not in torch  # a range: a user's CUDA build beside vLLM must satisfy it
