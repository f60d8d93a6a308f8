"""`draftsmith plan`: how long regeneration takes, what GPUs and disk it needs, before spending them;
`draftsmith plan train`: the same for a drafter training run (wall time and memory per GPU).

`plan` is a command group whose own options plan a regeneration run, so `draftsmith plan
--samples 914k ...` works as it always has; `plan train` is its subcommand over `TrainPlanConfig`.
`plan --train ...` (the old mode flag) still works as a deprecated spelling of `plan train ...`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from typer.core import TyperGroup

from draftsmith.core.config import config_command
from draftsmith.core.io import dumps_json
from draftsmith.plan.config import EnginePlanConfig, PlanConfig, TrainPlanConfig

_JSON = {"as_json": (bool, typer.Option(False, "--json", help="Print the plan as JSON instead of tables."))}


def plan(config: PlanConfig, config_file: Path | None = None, as_json: bool = False) -> None:
    """Plan a regeneration run: wall time, rate cross-check, sensitivity, GPUs for a deadline, storage.

    `draftsmith plan train --help`: plan a drafter training run instead.
    """
    from draftsmith.plan.capacity import make_plan
    from draftsmith.plan.config import build_inputs
    from draftsmith.plan.report import render_plan

    # The plan file resolves its relative paths against its own folder, so plan reads it itself.
    result = make_plan(build_inputs(config_file, _flags_given(config)))
    _emit(result, render_plan, as_json)


def plan_train(config: TrainPlanConfig, config_file: Path | None = None, as_json: bool = False) -> None:
    """Plan a drafter training run: wall time online/offline, memory per GPU, dense vs sparse attention."""
    from draftsmith.plan.config import build_train_inputs
    from draftsmith.plan.report import render_train_plan
    from draftsmith.plan.training import make_train_plan

    result = make_train_plan(build_train_inputs(config_file, _flags_given(config)))
    _emit(result, render_train_plan, as_json)


def plan_engine(config: EnginePlanConfig, as_json: bool = False) -> None:
    """How fast decode could go on these GPUs (the memory-bandwidth and compute ceiling), the share a measured
    rate is of it, and the ranked knobs (batch, FP8, state copies, speculation, TP) that close the gap."""
    from draftsmith.plan.engine import make_engine_plan
    from draftsmith.plan.report import render_engine_plan

    _emit(make_engine_plan(config), render_engine_plan, as_json)


def plan_speculation(config, as_json: bool = False) -> None:
    """How many draft tokens (K) at which concurrency: tau, the verify and draft step times and output tok/s
    per K from a measured per-position acceptance profile, beside no speculation and n-gram."""
    from draftsmith.plan.speculation import make_speculation_plan, render_speculation_plan

    _emit(make_speculation_plan(config), render_speculation_plan, as_json)


def plan_device(config, as_json: bool = False) -> None:
    """Measure this machine (memory-bound copy, bf16/fp32 matmuls, memory) as a device entry that --gpu FILE takes."""
    from draftsmith.plan.device import plan_device as measure

    measure(config, as_json)


def _flags_given(config) -> dict:
    return config.model_dump(include=config.model_fields_set)


def _emit(result, render, as_json: bool) -> None:
    if as_json:
        typer.echo(dumps_json(result.to_dict()))
    else:
        render(result)


class _PlanGroup(TyperGroup):
    """`plan --train ARGS` (deprecated) is read as `plan train ARGS`."""

    def parse_args(self, ctx, args):
        if "--train" in args:
            print("draftsmith: `plan --train` is deprecated; use `draftsmith plan train`", file=sys.stderr)
            args = ["train", *[arg for arg in args if arg != "--train"]]
        return super().parse_args(ctx, args)


def register(app: typer.Typer) -> None:
    group = typer.Typer(cls=_PlanGroup, add_completion=False, pretty_exceptions_enable=False)
    # The group's own options are `plan`'s; they apply only when no subcommand is given.
    command = config_command(typer.Typer(), "plan", PlanConfig, plan, own_config_file=True, extras=_JSON)

    def plan_command(**values):
        if values["cli_context"].invoked_subcommand is None:
            return command(**values)
        return None

    plan_command.__signature__ = command.__signature__  # type: ignore[attr-defined]
    plan_command.__doc__ = command.__doc__
    plan_command.config_model = PlanConfig  # type: ignore[attr-defined]
    group.callback(invoke_without_command=True)(plan_command)
    config_command(group, "train", TrainPlanConfig, plan_train, own_config_file=True, extras=_JSON)
    config_command(group, "engine", EnginePlanConfig, plan_engine, extras=_JSON)
    from draftsmith.plan.device import DevicePlanConfig
    from draftsmith.plan.speculation import SpeculationPlanConfig

    config_command(group, "speculation", SpeculationPlanConfig, plan_speculation, extras=_JSON)
    config_command(group, "device", DevicePlanConfig, plan_device,
                   extras={"as_json": (bool, typer.Option(False, "--json", help="Print the device entry as JSON."))})
    app.add_typer(group, name="plan")
