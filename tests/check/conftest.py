from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Tiny models on a shared 2-core machine: multi-threaded GEMMs stall on oversubscription.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def dflash_reference():
    """The reference `dflash` package; under CI (CI=true) its absence fails instead of skipping."""
    from draftsmith.check.parity import reference_available

    available, why = reference_available()
    if not available:
        message = f"reference dflash not importable ({why}); install it: pip install --no-deps dflash==0.1.0"
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(message + " (required under CI=true)", pytrace=False)
        pytest.skip(message)
    import dflash

    return dflash


@pytest.fixture(scope="session")
def good_export(tiny_target_dir, tmp_path_factory) -> Path:
    """A good export from a short real training run on the tiny target (the target's own greedy
    answers to 2 prompts, 40 steps, `export`; 2 held-out prompts), built once per session."""
    from draftsmith.gates.overfit import prepare_overfit

    prepared = prepare_overfit(tiny_target_dir, tmp_path_factory.mktemp("good") / "run", samples=2, steps=40,
                               max_new_tokens=48, eval_prompts=2)
    return Path(prepared.export_dir)


@pytest.fixture
def export_copy(good_export, tmp_path):
    """A fresh copy of the good export to plant one fault in."""

    def copy(name: str = "export") -> Path:
        return Path(shutil.copytree(good_export, tmp_path / name))

    return copy
