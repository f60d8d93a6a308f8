"""`draftsmith tokenize`: conversations -> masked Parquet shards, then an audit of what was written."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.core.config import config_command


def _run_audit(output_dir: Path, tokenizer_path: str, console) -> bool:
    """Audit the shards just written and print the verdict (the tokenizer enables span checks)."""
    from draftsmith.audit import audit_tokenized

    report = audit_tokenized(output_dir, tokenizer=tokenizer_path)
    report.render(console)
    console.print(f"audit: {report.verdict}")
    return bool(report.passed)


def tokenize(config, audit: bool = True) -> None:
    """Apply the target's chat template and build loss masks (1 = assistant tokens to learn)."""
    from rich.console import Console

    from draftsmith.tokenize.pipeline import TokenizeError, tokenize_dataset

    console = Console(stderr=True)
    try:
        summary = tokenize_dataset(config.inputs, config.tokenizer, config.out, config.options())
    except TokenizeError as error:
        if error.summary is not None:
            error.summary.render(console)
        raise
    summary.render(console)
    if audit and not _run_audit(config.out, config.tokenizer, console):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    from draftsmith.tokenize.pipeline import TokenizeConfig

    config_command(
        app, "tokenize", TokenizeConfig, tokenize,
        extras={"audit": (bool, typer.Option(True, "--audit/--no-audit", help="Audit the written shards afterwards."))},
    )
