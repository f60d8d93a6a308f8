"""`draftsmith export`: write the serving-engine checkpoint directory for a trained drafter."""

from __future__ import annotations

import typer

from draftsmith.core.config import config_command
from draftsmith.export.config import ExportConfig


def export(config: ExportConfig) -> None:
    """Export a drafter for SGLang / vLLM; verifies the written files reproduce its outputs."""
    from draftsmith.export.exporter import export_drafter

    result = export_drafter(
        config.drafter, config.out, dtype=config.dtype, overwrite=config.force, check_reference=config.check_reference,
        check_engines=config.check_engines,
    )
    for support in result.engines:
        typer.echo(f"draftsmith export: engine: {support.line()}", err=True)
    typer.echo(result.summary())


def register(app: typer.Typer) -> None:
    config_command(app, "export", ExportConfig, export)
