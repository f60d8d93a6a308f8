"""`draftsmith tiny`: build the tiny default target and synthetic data."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    tiny = typer.Typer(help="The built-in tiny target model and synthetic prompts.", no_args_is_help=True)

    @tiny.command("build")
    def build_command(
        out: Path = typer.Option(None, help="Directory to write; default: the cache."),
        steps: int = typer.Option(None, help="Training steps (default from the spec)."),
        force: bool = typer.Option(False, help="Rebuild even when a finished build exists."),
    ) -> None:
        """Build (or reuse) the tiny target and print its directory."""
        from draftsmith.tiny.build import TinyTargetSpec, build_tiny_target

        spec = TinyTargetSpec() if steps is None else TinyTargetSpec(train_steps=steps)
        path = build_tiny_target(out, spec=spec, force=force, log=lambda m: typer.echo(m, err=True))
        typer.echo(str(path))

    @tiny.command("prompts")
    def prompts_command(
        out: Path = typer.Argument(..., help="JSONL file of prompt rows to write."),
        count: int = typer.Option(200, min=1),
        seed: int = typer.Option(1),
    ) -> None:
        """Write synthetic prompts (OpenAI `messages`, no final answer) as JSONL."""
        from draftsmith.tiny.corpus import synthetic_prompts

        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w") as handle:
            for row in synthetic_prompts(count, seed=seed):
                handle.write(json.dumps(row) + "\n")
        typer.echo(f"wrote {count} prompts to {out}")

    app.add_typer(tiny, name="tiny")
