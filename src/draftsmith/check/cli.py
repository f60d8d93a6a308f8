"""`draftsmith check EXPORT --target DIR`: exit 0 clean, 1 with findings, 2 for unusable input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from draftsmith.check.config import CheckConfig
from draftsmith.core.config import config_command
from draftsmith.core.errors import InputError


def _check(config: CheckConfig, as_json: bool = False, overfit: Callable[..., dict[str, Any]] | None = None) -> None:
    """Check an exported drafter against its target: layer ids, feature, mask token, heads, RoPE,
    sliding window, shapes, block size and template, then logit parity with the reference dflash."""
    from draftsmith.check.runner import check_export

    from draftsmith.core.limits import choose_threads

    if config.endpoint and not config.overfit:
        raise InputError("--endpoint is the overfit gate's server; pass --overfit with it")
    # Parity runs target and drafter on the CPU: threads from the machine's load unless --threads.
    _, threads_line = choose_threads(config.threads)
    summary = check_export(config)
    typer.echo(f"check: {threads_line}", err=True)  # after the inputs were read: a bad one stays one line
    if config.overfit:
        if overfit is None:
            raise InputError("--overfit is composed by the draftsmith command line; run it through `draftsmith check`")
        summary.overfit = overfit(config, summary)
        summary.checks.append("overfit")
    if as_json:
        typer.echo(summary.to_json())
        typer.echo(summary.verdict, err=True)
    else:
        for line in summary.lines():
            typer.echo(line)
    failed_gate = summary.overfit is not None and summary.overfit.get("passed") is False
    if not summary.passed or failed_gate:
        raise typer.Exit(1)


def register(app: typer.Typer, overfit: Callable[..., dict[str, Any]] | None = None) -> None:
    def run(config: CheckConfig, as_json: bool = False) -> None:
        _check(config, as_json=as_json, overfit=overfit)

    run.__doc__ = _check.__doc__
    config_command(app, "check", CheckConfig, run, extras={
        "as_json": (bool, typer.Option(False, "--json", help="Print the report as JSON on stdout.")),
    })
