"""`draftsmith audit PATH...`: exit 0 on PASS, 1 on FAIL (so pipelines stop), 2 on unusable input."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer
from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import cli, config_command


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


class AuditConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paths: Annotated[list[Path], cli(positional=True)] = Field(
        description="conversation files (JSONL/Parquet) or tokenized datasets"
    )
    tokenizer: str | None = Field(None, description="tokenizer dir: decodes spans, checks end-of-turn, headers, thinking")
    kind: Literal["auto", "tokenized", "conversations"] = "auto"
    split: str | None = Field(None, description="DatasetDict split to audit (default: train, else the only one)")
    plot: Path | None = Field(None, description="write a PNG histogram of trainable tokens per sample")
    max_context: int | None = Field(None, ge=1, description="context limit in tokens")
    threshold: Annotated[list[str], cli(split=False)] = Field(
        default_factory=list, description="override a gate: name=value (share like 0.05 or 5%, or 'none'); repeatable"
    )


def audit(config: AuditConfig, as_json: bool = False) -> None:
    """Audit a training set and gate it: PASS (exit 0) or FAIL (exit 1) with the reasons."""
    from rich.console import Console

    from draftsmith.audit.conversations import audit_conversations
    from draftsmith.audit.thresholds import Thresholds
    from draftsmith.audit.tokenized import audit_tokenized
    from draftsmith.data.sources import detect_kind

    limits = Thresholds.from_assignments(config.threshold)
    paths, tokenizer, max_context, plot = config.paths, config.tokenizer, config.max_context, config.plot
    chosen = detect_kind(paths, config.split) if config.kind == "auto" else config.kind
    stderr = Console(stderr=True)
    with _progress(stderr) as progress:
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
        typer.echo(json.dumps(report.to_dict(), indent=2))
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


class _progress:
    """A rich progress bar on a terminal (rows, rate, ETA); silent otherwise."""

    def __init__(self, console) -> None:
        self.console = console
        self.bar = None
        self.task = None

    def __enter__(self):
        if not self.console.is_terminal:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("auditing"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self.bar.__enter__()
        self.task = self.bar.add_task("audit", total=None, rate="")
        return self.update

    def update(self, done: int, total: int | None) -> None:
        elapsed = self.bar.tasks[0].elapsed or 0.0
        rate = f"{done / elapsed:,.0f} samples/s" if elapsed > 0 else ""
        self.bar.update(self.task, completed=done, total=total, rate=rate)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
