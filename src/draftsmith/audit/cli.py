"""`draftsmith audit PATH...`: exit 0 on PASS, 1 on FAIL (so pipelines stop), 2 on unusable input."""

from __future__ import annotations

import sys

import typer

from draftsmith.audit.config import AuditConfig
from draftsmith.core.config import config_command
from draftsmith.core.io import dumps_json


def _thresholds_epilog() -> str:
    from draftsmith.audit.thresholds import COUNT_THRESHOLDS, Thresholds

    parts = []
    for name, value in Thresholds().to_dict().items():
        shown = "off" if value is None else (str(value) if name in COUNT_THRESHOLDS else f"{value:g}")
        parts.append(f"{name}={shown}")
    return (
        "Gates (--threshold name=value; shares of all samples, except the sample counts "
        f"{' and '.join(COUNT_THRESHOLDS)}; a mask sum or span is dominant when its share is over "
        "the limit and at least dominant_min_count samples share it): " + ", ".join(parts) + "."
    )


def audit(config: AuditConfig, as_json: bool = False) -> None:
    """Audit a training set and gate it: PASS (exit 0) or FAIL (exit 1) with the reasons."""
    from rich.console import Console

    from draftsmith.audit.conversations import audit_conversations
    from draftsmith.audit.thresholds import Thresholds
    from draftsmith.audit.tokenized import audit_tokenized
    from draftsmith.core.lazy import require_optional
    from draftsmith.core.progress import Progress
    from draftsmith.data.sources import check_finished, detect_kind
    from draftsmith.data.tokenized import is_tokenize_output

    limits = Thresholds.from_assignments(config.threshold)
    paths, tokenizer, max_context, plot = config.paths, config.tokenizer, config.max_context, config.plot
    if plot is not None:
        require_optional("matplotlib", "--plot", "plot")
    check_finished(paths, config.allow_partial)
    chosen = config.kind
    if chosen == "auto":
        chosen = "tokenized" if all(map(is_tokenize_output, paths)) else detect_kind(paths, config.split)
    stderr = Console(stderr=True)
    with Progress("audit", unit="samples", console=stderr) as progress:
        if chosen == "tokenized":
            report = audit_tokenized(
                paths, tokenizer=tokenizer, thresholds=limits, max_context=max_context, progress=progress,
                split=config.split,
            )
        else:
            report = audit_conversations(
                paths, thresholds=limits, tokenizer=tokenizer, max_context=max_context, progress=progress,
                split=config.split,
            )
    if plot is not None:
        from draftsmith.audit.plot import plot_histogram

        plot_histogram(report, plot)
    if as_json:
        typer.echo(dumps_json(report.to_dict()))
        typer.echo(report.verdict, err=True)
    else:
        console = Console(width=max(Console().width, 120)) if not sys.stdout.isatty() else Console()
        if plot is not None:
            typer.echo(f"histogram written to {plot}", err=True)
        report.render(console)
    if not report.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    config_command(app, "audit", AuditConfig, audit, epilog=_thresholds_epilog(), extras={
        "as_json": (bool, typer.Option(False, "--json", help="Print the report as JSON on stdout.")),
    })
