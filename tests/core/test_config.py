"""The config -> command-line mechanism: flags from fields, --config files, one error line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import typer
from pydantic import BaseModel, Field

from draftsmith.cli import main
from draftsmith.core.config import DType, build_config, canonical_dtype, cli, config_command
from draftsmith.core.errors import InputError


class Inner(BaseModel):
    enabled: Annotated[bool, cli("--inner/--no-inner")] = True
    window: int = Field(10, ge=1)


class Demo(BaseModel):
    inputs: Annotated[list[Path], cli(positional=True)]
    out: Annotated[Path, cli("--out", "-o")] = Field(description="where to write")
    max_length: int = Field(3072, ge=2, description="tokens per row")
    lr: float = Field(6e-4, gt=0)
    mode: Literal["final", "all"] = "final"
    flag: bool = False
    layers: list[int] | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)
    dtype: DType = "auto"
    inner: Inner = Field(default_factory=Inner)


def run_demo_command(args: list[str], capsys) -> tuple[int, Any, str]:
    app = typer.Typer(pretty_exceptions_enable=False)
    seen: dict[str, Any] = {}

    def run(config: Demo, as_json: bool = False) -> None:
        seen["config"], seen["as_json"] = config, as_json

    config_command(app, "demo", Demo, run, extras={"as_json": (bool, typer.Option(False, "--json"))})
    config_command(app, "other", Inner, lambda config: None)  # two commands: the sub-command name is required
    try:
        result = app(args=["demo", *args], standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except InputError as error:
        print(f"error: {error}", file=__import__("sys").stderr)
        code = 2
    return code, seen, capsys.readouterr().err


def test_fields_become_flags_of_every_kind(tmp_path, capsys):
    code, seen, _ = run_demo_command(
        ["a.jsonl", "b.jsonl", "-o", str(tmp_path), "--max-length", "128", "--mode", "all", "--flag",
         "--layers", "1,2", "--layers", "5", "--kwargs", "enable_thinking=false", "--kwargs", '{"x": 1}',
         "--dtype", "bf16", "--no-inner", "--inner-window", "3", "--json"],
        capsys,
    )
    assert code == 0
    config = seen["config"]
    assert config.inputs == [Path("a.jsonl"), Path("b.jsonl")] and config.out == tmp_path
    assert (config.max_length, config.mode, config.flag, config.layers) == (128, "all", True, [1, 2, 5])
    assert config.kwargs == {"enable_thinking": False, "x": 1}
    assert config.dtype == "bfloat16" and config.inner == Inner(enabled=False, window=3) and seen["as_json"]
    assert config.lr == 6e-4  # untouched defaults come from the model


@pytest.mark.parametrize("suffix", [".yaml", ".toml", ".json"])
def test_config_file_with_flag_keys_and_flags_winning(tmp_path, capsys, suffix):
    values = {"inputs": ["x.jsonl"], "out": "o", "max-length": 64, "lr": 0.5, "mode": "all",
              "inner": {"window": 7}, "dtype": "fp16"}
    path = tmp_path / f"settings{suffix}"
    if suffix == ".toml":
        path.write_text('inputs = ["x.jsonl"]\nout = "o"\nmax-length = 64\nlr = 0.5\nmode = "all"\n'
                        'dtype = "fp16"\n[inner]\nwindow = 7\n')
    else:
        path.write_text(json.dumps(values))  # JSON is also YAML
    code, seen, err = run_demo_command(["--config", str(path), "--lr", "0.25"], capsys)
    assert code == 0, err
    config = seen["config"]
    assert config.inputs == [Path("x.jsonl")] and config.max_length == 64 and config.mode == "all"
    assert config.lr == 0.25 and config.inner.window == 7 and config.dtype == "float16"


def test_validation_errors_name_the_flag_or_the_file_key(tmp_path, capsys):
    code, _, err = run_demo_command(["a", "-o", "o", "--lr", "0", "--mode", "x", "--dtype", "fp8"], capsys)
    assert code == 2
    assert "--lr: Input should be greater than 0" in err and "--mode: Input should be 'final' or 'all'" in err
    assert "--dtype must be one of" in err and len(err.strip().splitlines()) == 1
    path = tmp_path / "c.yaml"
    path.write_text("out: o\nmax_length: 1\n")
    code, _, err = run_demo_command(["a", "--config", str(path)], capsys)
    assert code == 2 and f"{path}: max-length: Input should be greater than or equal to 2" in err
    path.write_text("out: o\nmax_lenght: 5\n")
    code, _, err = run_demo_command(["a", "--config", str(path)], capsys)
    assert code == 2 and "unknown key 'max-lenght'" in err
    code, _, err = run_demo_command(["a"], capsys)
    assert code == 2 and "--out is required" in err


def test_build_config_from_python_without_a_command_line():
    config = build_config(Demo, {"lr": 0.1}, base={"inputs": ["a"], "out": "o"})
    assert config.lr == 0.1 and config.out == Path("o")


def test_one_dtype_vocabulary():
    assert {canonical_dtype(name) for name in ("bf16", "bfloat16", "BF16", "torch.bfloat16")} == {"bfloat16"}
    assert canonical_dtype("fp16") == canonical_dtype("float16") == "float16"
    assert canonical_dtype("fp32") == canonical_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="must be one of"):
        canonical_dtype("auto", allow_auto=False)


def test_every_stage_takes_both_dtype_spellings():
    from draftsmith.evaluate.config import EvalConfig
    from draftsmith.export.config import ExportConfig
    from draftsmith.train.config import ExtractConfig, TrainConfig

    for spelling, canonical in (("bf16", "bfloat16"), ("bfloat16", "bfloat16"), ("fp32", "float32"), ("float32", "float32")):
        assert TrainConfig(target="t", data="d", out="o", dtype=spelling).dtype == canonical
        assert ExtractConfig(target="t", data="d", out="o", dtype=spelling).dtype == canonical
        assert ExportConfig(drafter="d", out="o", dtype=spelling).dtype == canonical
        assert EvalConfig(target="t", drafter="d", prompts="p", dtype=spelling).dtype == canonical


def test_train_bad_flag_is_one_line_exit_2(tmp_path, capsys):
    code = main(["train", "--target", "t", "--data", "d", "--out", str(tmp_path), "--lr", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == "draftsmith: error: --lr: Input should be greater than 0 (got 0.0)"
    path = tmp_path / "train.yaml"
    path.write_text("target: t\ndata: d\nout: o\ndraft-layers: 0\n")
    assert main(["train", "--config", str(path)]) == 2
    assert f"{path}: draft-layers: Input should be greater than or equal to 1" in capsys.readouterr().err


@pytest.mark.parametrize("stage", ["plan", "audit", "bench", "generate", "tokenize", "train", "extract", "eval",
                                   "export", "serve", "demo"])
def test_every_stage_command_takes_a_config_file(stage, capsys):
    assert main([stage, "--help"]) == 0
    assert "--config" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ["audit", "train", "generate", "check", "plan"])
def test_help_shows_no_value_type_beside_a_flag(stage):
    # A real process: rich renders help differently inside pytest's captured output.
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    result = subprocess.run([sys.executable, "-m", "draftsmith", stage, "--help"], capture_output=True, text=True,
                            env=env, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "--help" in result.stdout and "<bool>" not in result.stdout


def test_cli_panels_group_the_help_and_a_misspelt_field_is_refused():
    from typing import ClassVar

    import typer
    from pydantic import BaseModel, Field
    from typer.testing import CliRunner

    from draftsmith.core.config import config_command

    class Settings(BaseModel):
        cli_panels: ClassVar[dict[str, tuple[str, ...]]] = {"Optimizer": ("lr", "betas"), "Data": ("data",)}
        data: str = Field("d", description="where the rows are")
        lr: float = Field(1e-3, description="peak learning rate")
        betas: tuple[float, float] = (0.9, 0.95)
        seed: int = Field(0, description="the run's seed")

    app = typer.Typer()
    config_command(app, "go", Settings, lambda config: typer.echo(config.model_dump_json()))
    config_command(app, "other", Settings, lambda config: None)  # two commands: `go` stays a sub-command
    result = CliRunner().invoke(app, ["go", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert text.index("Data") < text.index("--data") and text.index("Optimizer") < text.index("--lr")
    assert "--seed" in text.split("Optimizer")[0] or "--seed" in text.split("Data")[0]  # unlisted: the Options panel
    ran = CliRunner().invoke(app, ["go", "--lr", "0.5"])
    assert ran.exit_code == 0 and '"lr":0.5' in ran.output  # panels change the help only

    class Misspelt(Settings):
        cli_panels: ClassVar[dict[str, tuple[str, ...]]] = {"Optimizer": ("learning_rate",)}

    with pytest.raises(TypeError, match="names 'learning_rate', which is not a field"):
        config_command(typer.Typer(), "bad", Misspelt, lambda config: None)


def test_a_typer_without_the_rich_type_hook_still_builds_the_cli(monkeypatch):
    """A GPU image's older typer has no TyperOption.display_type_rich: every command crashed on import."""
    import typer

    from draftsmith.core import config as core_config

    monkeypatch.delattr(typer.core.TyperOption, "display_type_rich", raising=False)
    core_config._flags_show_no_value_type()  # no AttributeError
