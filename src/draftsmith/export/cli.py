"""`draftsmith export`: write the serving-engine checkpoint directory for a trained drafter."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export_command(
        drafter: Path = typer.Option(..., help="Drafter directory, or a `draftsmith train` output directory."),
        out: Path = typer.Option(..., help="Directory to write (config.json + model.safetensors + README.md)."),
        dtype: str = typer.Option(None, help="float32, bfloat16 or float16 (default: keep the checkpoint's)."),
        force: bool = typer.Option(False, help="Replace a non-empty --out directory."),
        check_reference: bool = typer.Option(
            True, "--check-reference/--no-check-reference", help="Compare outputs with the reference dflash package."
        ),
    ) -> None:
        """Export a drafter for SGLang / vLLM; verifies the written files reproduce its outputs."""
        from draftsmith.export.exporter import export_drafter

        result = export_drafter(drafter, out, dtype=dtype, overwrite=force, check_reference=check_reference)
        typer.echo(result.summary())
