"""Shared fixtures: the tiny target is built once per machine and cached by its settings."""

from __future__ import annotations

import json
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


def session_root(tmp_path_factory) -> Path:
    """This test session's temporary root, the same for every pytest-xdist worker of the session
    (each worker's own `getbasetemp()` is a folder below it)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


@pytest.fixture(scope="session")
def small_demo(tmp_path_factory):
    """One small demo run per session (about a minute): its trained drafter and serving export are
    shared by the demo test and the engine tests that serve the export through vLLM. Under
    pytest-xdist the first worker that needs it runs it and the others read its result."""
    from draftsmith.core.lock import waiting_lock
    from draftsmith.demo import DemoConfig, DemoResult, run_demo

    root = session_root(tmp_path_factory)
    record = root / "small-demo.json"
    with waiting_lock(root / "small-demo.lock"):
        if record.exists():
            return DemoResult(**json.loads(record.read_text()))
        result = run_demo(
            DemoConfig(workdir=root / "small-demo" / "demo", train_prompts=160, eval_prompts=6, train_steps=120,
                       eval_max_new_tokens=96, threads=1),
            log=lambda message: None,
        )  # fmt: skip
        record.write_text(json.dumps(result.to_dict()))
        return result


# The files that take longest on the CI machine (`.ci/run` prints the slowest tests), run first: with
# `pytest -n 2 --dist loadfile --no-loadscope-reorder` a worker takes the next file as it frees up,
# so the long ones overlap each other and the many short files instead of ending the run alone.
SLOWEST_FIRST = (
    "tests/models/test_smollm2_demo.py",
    "tests/engines/test_mask_embedding_vllm.py",
    "tests/engines/test_check_overfit.py",
    "tests/engines/test_generate_engines.py",
    "tests/train/test_distributed.py",
    "tests/models/test_smollm2_stages.py",
    "tests/core/test_signals.py",
    "tests/engines/test_dflash_vllm.py",
    "tests/engines/test_bench_engines.py",
    "tests/test_bad_inputs.py",
    "tests/train/test_run_checks.py",
    "tests/test_gpu_check.py",
    "tests/tokenize/test_tokenize_signals.py",
    "tests/demo/test_demo.py",
    "tests/evaluate/test_dspark_speculative.py",
    "tests/train/test_eval_prompts.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    root = Path(str(config.rootpath))

    def key(item) -> int:
        path = Path(str(item.fspath))
        return rank.get(path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path), len(rank))

    items.sort(key=key)  # stable: every other file and every test within a file keep their order


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
