"""`draftsmith plan data`, added to the `plan` group by `draftsmith.cli` (it composes stages)."""

from __future__ import annotations

import typer

from draftsmith.core.config import config_command
from draftsmith.core.io import dumps_json
from draftsmith.datacurve.config import DataCurveConfig


def plan_data_command(config: DataCurveConfig, as_json: bool = False) -> None:
    """How much regenerated data is worth it: train the recipe (every `train` flag) on nested subsets, measure held-out tau,
    fit the curve and say tau, days and GPU-hours at each size; --smoke: does the data and recipe work at all."""
    from rich.console import Console

    from draftsmith.datacurve.runner import plan_data

    summary = plan_data(config)
    if as_json:
        typer.echo(dumps_json(summary.to_dict()))
    else:
        summary.render(Console(soft_wrap=True))
    if not summary.ok:
        raise typer.Exit(1)


def register(plan_group: typer.Typer) -> None:
    config_command(plan_group, "data", DataCurveConfig, plan_data_command,
                   extras={"as_json": (bool, typer.Option(False, "--json", help="Print the curve and plan as JSON instead of tables."))})
