"""Shared fixtures: the tiny target is built once per machine and cached by its settings."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest


@pytest.fixture
def prompts_seed() -> int:
    """The synthetic_prompts seed `prompts_file` uses unless a call passes one (a conftest may override it)."""
    return 3


@pytest.fixture
def prompts_file(tmp_path, prompts_seed):
    """make(count, name=..., seed=...) -> a JSONL file of `count` synthetic prompt rows under tmp_path."""
    import json

    from draftsmith.tiny import synthetic_prompts

    def make(count: int, name: str = "prompts.jsonl", seed: int | None = None) -> Path:
        path = tmp_path / name
        with path.open("w") as handle:
            for row in synthetic_prompts(count, seed=prompts_seed if seed is None else seed):
                handle.write(json.dumps(row) + "\n")
        return path

    return make


@pytest.fixture(scope="session")
def tiny_target_dir() -> Path:
    """The default tiny target (trained Qwen3 + tokenizer with a `<think>` chat template)."""
    from draftsmith.tiny import build_tiny_target

    return build_tiny_target(log=lambda message: print(message))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_target_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_target_dir)


def pytest_configure(config):
    # Tests never reach a model hub; everything they load is built locally.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # A suite started in the background by a shell without job control (`cmd &` in a script)
    # inherits SIGINT ignored, and so would every process the tests start and then interrupt:
    # the Ctrl-C tests would time out. The processes they start get the default back.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def small_demo(tmp_path_factory):
    """One small demo run per session (about a minute): its trained drafter and serving export are
    shared by the demo test and the engine tests that serve the export through vLLM."""
    from draftsmith.demo import DemoConfig, run_demo

    return run_demo(
        DemoConfig(workdir=tmp_path_factory.mktemp("demo") / "demo", train_prompts=160, eval_prompts=6,
                   train_steps=120, eval_max_new_tokens=96, threads=1),
        log=lambda message: None,
    )


def running_in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI (`CI=true`) a test skipped by `pytest.importorskip` fails instead: CI installs every
    package the tests compare against (the reference `dflash`, ...), so a missing one is a broken
    install, never a silent green (like the engine tests)."""
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and call.excinfo is not None and running_in_ci()):
        return
    if any(entry.name == "importorskip" for entry in call.excinfo.traceback):
        report.outcome = "failed"
        report.longrepr = f"required under CI, but not importable: {call.excinfo.value}"
