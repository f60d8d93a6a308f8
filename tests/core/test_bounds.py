"""Every number a command takes has a ceiling, on every path a config is built by.

Each numeric flag of every command the CLI has (found by walking the app, so a new flag is covered
the day it is added) is refused past its ceiling in one line naming it; the cases a fault probe
found (a window that torch wraps negative, 100,000 threads, a block of 10**8) exit 2 with one line
through the real CLI, a config file and the Python API alike.
"""

from __future__ import annotations

import pytest
import typer
from pydantic import ValidationError

from draftsmith.cli import app, main
from draftsmith.core.config import _element_type, _is_number_type, _members, build_config, check_numbers, options_of, validate_config
from draftsmith.core.errors import InputError
from draftsmith.core.limits import MAX_BLOCK_SIZE, MAX_SEQUENCE_TOKENS, MAX_SETTING, choose_threads, max_threads, usable_cpus
from draftsmith.core.manifest import check_manifest
from draftsmith.train.config import TrainConfig


def _commands(command=None, path=()):
    command = command or typer.main.get_command(app)
    if getattr(command.callback, "config_model", None) is not None:
        yield " ".join(path), command.callback.config_model
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


# What a command needs besides the number under test (its required inputs; eval's mode).
_NEEDS = {"EvalConfig": {"target": "t", "drafter": "d"}}


def _numeric_flags():
    for name, model in _commands():
        for option in options_of(model):
            element = _element_type(option.info.annotation)
            if _is_number_type(option.info.annotation) or _is_number_type(element):
                yield pytest.param(model, option, id=f"{name} {option.flag}")


def _required(model) -> dict:
    values = {}
    for option in options_of(model):
        if option.info.is_required():
            values[option.path[0]] = ["x"] if option.kind == "list" else "x"
    return {**values, **_NEEDS.get(model.__name__, {})}


def test_every_command_with_numbers_is_walked():
    names = {pytest_param.id.split(" --")[0] for pytest_param in _numeric_flags()}
    assert {"train", "extract", "eval", "generate", "bench", "tokenize", "check", "demo", "serve", "plan device"} <= names


@pytest.mark.parametrize("model, option", list(_numeric_flags()))
def test_every_numeric_flag_refuses_a_number_past_any_ceiling(model, option):
    element = _element_type(option.info.annotation)
    floating = float in _members(element if element is not None else option.info.annotation)
    huge = 1e160 if floating else 2**63  # torch wraps 2**63 to a negative
    value = [str(huge)] if option.kind == "list" else huge
    with pytest.raises(InputError) as refused:
        build_config(model, {option.param: value}, base=_required(model))
    message = str(refused.value)
    assert option.flag in message and "\n" not in message, message


@pytest.mark.parametrize("argv, message", [
    (["train", "--draft-sliding-window", str(2**63)], f"--draft-sliding-window: Input should be less than or equal to {MAX_SEQUENCE_TOKENS}"),
    (["train", "--draft-sliding-window", str(2**64)], "--draft-sliding-window: Input should be less than or equal to"),
    (["train", "--threads", "100000"], "--threads must be 1.."),
    (["train", "--block-size", str(10**8)], f"--block-size: Input should be less than or equal to {MAX_BLOCK_SIZE}"),
    (["train", "--seed", str(2**63)], f"--seed: 9.22e+18 is beyond any setting (at most {MAX_SETTING:.0e})"),
    (["train", "--lr", "1e160"], "--lr: 1e+160 is beyond any setting"),
    (["train", "--target-layer-ids", "1,,3"], "--target-layer-ids '1,,3': item 2 is empty (two commas in a row?)"),
    (["extract", "--threads", "100000"], "--threads must be 1.."),
    (["eval", "--prompts", "p", "--target", "t", "--drafter", "d", "--block-size", str(10**8)], "--block-size: Input should be less than or equal to"),
    (["eval", "--prompts", "p", "--target", "t", "--drafter", "d", "--block-size", str(10**11)], "--block-size: Input should be less than or equal to"),
    (["eval", "--prompts", "p", "--target", "t", "--drafter", "d", "--threads", "100000"], "--threads must be 1.."),
    (["check", "e", "--target", "t", "--threads", "100000"], "--threads must be 1.."),
    (["demo", "--threads", "100000"], "--threads must be 1.."),
    (["demo", "--max-tokens", str(10**9)], "--max-tokens: Input should be less than or equal to"),
    (["plan", "device", "--measure", "--threads", "100000"], "--threads must be 1.."),
    (["generate", "in.jsonl", "-o", "out", "-e", "http://127.0.0.1:9", "--timeout", "1e300"], "--timeout: 1e+300 is beyond any setting"),
])
def test_the_fault_probes_numbers_are_one_line_and_exit_2(capsys, tmp_path, argv, message):
    if argv[0] in ("train", "extract"):
        argv = [*argv, "--target", "t", "--data", "d", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("draftsmith: error: "), err
    assert message in err, err
    assert not (tmp_path / "out").exists()


def test_a_config_file_goes_through_the_same_ceilings(capsys, tmp_path):
    config = tmp_path / "train.yaml"
    for text, message in ((f"draft_sliding_window: {2**63}\n", "draft-sliding-window: Input should be less than or equal to"),
                          ("threads: 100000\n", "threads must be 1.."),
                          ("seed: 1.0e+300\n", "seed"),
                          ("lr: 1.0e+300\n", "lr: 1e+300 is beyond any setting")):
        config.write_text(text)
        assert main(["train", "--target", "t", "--data", "d", "--out", str(tmp_path / "o"), "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{config}: " in err and message in err, err


def test_the_python_api_refuses_them_too(tmp_path):
    needed = {"target": "t", "data": "d", "out": str(tmp_path / "o")}
    with pytest.raises(ValidationError, match="draft_sliding_window"):
        TrainConfig(**needed, draft_sliding_window=2**63)  # a config built directly: pydantic's own check
    with pytest.raises(ValidationError, match="num_threads"):
        TrainConfig(**needed, num_threads=100_000)
    with pytest.raises(InputError, match=r"^--draft-sliding-window: Input should be less than or equal to"):
        validate_config(TrainConfig, {**needed, "draft_sliding_window": 2**63})
    built = TrainConfig(**needed, seed=2**63)  # a field without a range of its own: the number rule's ceiling
    with pytest.raises(InputError, match=r"^--seed: 9.22e\+18 is beyond any setting"):
        check_numbers(built)
    with pytest.raises(InputError, match=r"^seed: 9.22e\+18 is beyond any setting"):
        check_manifest(tmp_path, "train", {"seed": built.seed})  # what every stage's run records, checked first
    assert not (tmp_path / "manifest.json").exists()


def test_an_enormous_integer_is_named_without_converting_it():
    with pytest.raises(InputError, match=r"a 400-digit number is beyond any setting"):
        check_numbers({"seed": 10**399})


# ---- the one thread policy ----------------------------------------------------------------------


def test_threads_are_bounded_by_this_machine():
    assert max_threads() == 4 * usable_cpus()
    with pytest.raises(InputError, match=rf"--threads must be 1..{max_threads()} \(4 per CPU"):
        validate_config(TrainConfig, {"target": "t", "data": "d", "out": "o", "num_threads": max_threads() + 1})
    assert validate_config(TrainConfig, {"target": "t", "data": "d", "out": "o", "num_threads": max_threads()}).num_threads == max_threads()


def test_the_thread_choice_is_set_and_said(monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        threads, line = choose_threads(None)
        assert torch.get_num_threads() == threads and 1 <= threads <= usable_cpus()
        assert line.startswith(f"threads: {threads} (") and "load" in line and "--threads N to choose" in line
        assert choose_threads(1) == (1, "threads: 1 (as asked, --threads)") and torch.get_num_threads() == 1
        assert choose_threads(None, on_cpu=False) == (1, None)  # a GPU run keeps torch's setting, says nothing
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(4 * usable_cpus()))  # torchrun's ranks here split the idle CPUs
        threads, line = choose_threads(None)
        assert threads == 1 and f"per process ({4 * usable_cpus()} processes here, " in line
        with pytest.raises(ValueError, match="must be 1.."):
            choose_threads(max_threads() + 1)
    finally:
        torch.set_num_threads(before)


def test_every_cpu_stage_takes_threads_through_the_bounded_type():
    from draftsmith.core.config import Threads

    takes = {name: model for name, model in _commands()}
    for name, field in (("train", "num_threads"), ("extract", "threads"), ("eval", "threads"), ("check", "threads"),
                        ("demo", "threads"), ("plan device", "threads")):
        annotation = takes[name].model_fields[field].annotation
        assert Threads in getattr(annotation, "__args__", ()), (name, annotation)
