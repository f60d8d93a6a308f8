"""`draftsmith plan`: how long regeneration takes, what GPUs and disk it needs, before spending them."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from draftsmith.core.config import config_command
from draftsmith.plan.config import PlanFlags


def plan(flags: PlanFlags, config_file: Path | None = None, as_json: bool = False) -> None:
    """Plan a regeneration run: wall time, rate cross-check, sensitivity, GPUs for a deadline, storage.

    With --train: plan a drafter training run (wall time online/offline, memory per GPU, dense vs sparse attention).
    """
    # The plan file resolves its relative paths against its own folder, so plan reads it itself.
    if flags.train:
        from draftsmith.plan.config import build_train_inputs
        from draftsmith.plan.report import render_train_plan
        from draftsmith.plan.training import make_train_plan

        result = make_train_plan(build_train_inputs(config_file, flags.train_overrides()))
        render = render_train_plan
    else:
        from draftsmith.plan.capacity import make_plan
        from draftsmith.plan.config import build_inputs
        from draftsmith.plan.report import render_plan

        result = make_plan(build_inputs(config_file, flags.plan_overrides()))
        render = render_plan
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        render(result)


def register(app: typer.Typer) -> None:
    config_command(app, "plan", PlanFlags, plan, own_config_file=True, extras={
        "as_json": (bool, typer.Option(False, "--json", help="Print the plan as JSON instead of tables.")),
    })
