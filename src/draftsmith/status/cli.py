"""`draftsmith status`: the CLI over ``draftsmith.status.status``.

Exit codes: 0 running and healthy, or finished; 1 stalled, dead or failing; 2 bad input. With
``--watch`` the screen is redrawn in place until Ctrl-C (the exit code is the last view's).
"""

from __future__ import annotations

import time

import typer

from draftsmith.core.config import config_command
from draftsmith.core.io import dumps_json


def status(config, watch: str | None = None, as_json: bool = False) -> None:
    """Watch a stage's output directory (or several nodes' shards): progress, rates, ETA, failures,
    output lengths against the plan, the writer and the disk. Reads only; never disturbs the writer."""
    from rich.console import Console

    from draftsmith.status import parse_interval
    from draftsmith.status import status as read_status
    from draftsmith.status.render import render

    interval = parse_interval(watch, "--watch") if watch is not None else None
    summary = read_status(config)
    if interval is None:
        if as_json:
            typer.echo(dumps_json(summary.to_dict(), indent=None))
        else:
            Console().print(render(summary))
        raise typer.Exit(summary.exit_code)
    if as_json:  # one JSON object per refresh (JSON lines), for a pipe
        while True:
            typer.echo(dumps_json(summary.to_dict(), indent=None))
            time.sleep(interval)
            summary = read_status(config)
    from rich.live import Live

    with Live(render(summary), console=Console(), auto_refresh=False, transient=False) as live:
        while True:
            time.sleep(interval)
            summary = read_status(config)
            live.update(render(summary), refresh=True)


def register(app: typer.Typer) -> None:
    from draftsmith.status.config import StatusConfig

    config_command(app, "status", StatusConfig, status, extras={
        "watch": (str | None, typer.Option(None, "--watch", metavar="SECONDS", help="Redraw every SECONDS (or 30s, 1m) until Ctrl-C.")),
        "as_json": (bool, typer.Option(False, "--json", help="Print the status as one JSON object on stdout.")),
    })
