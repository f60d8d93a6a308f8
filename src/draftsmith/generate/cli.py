"""`draftsmith generate`: the CLI over ``draftsmith.generate.generate``.

Exit codes: 0 all samples done; 1 some failed or remain (rerun to resume / see the failures file);
2 bad input; 3 the quality guard stopped the run; 130 interrupted.
"""

from __future__ import annotations

import typer

from draftsmith.core.config import config_command
from draftsmith.core.errors import InputError
from draftsmith.core.io import dumps_json


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` -> (i, N) with 0 <= i < N."""
    try:
        index_text, count_text = text.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise InputError(f"--shard must look like i/N (e.g. 0/4), got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise InputError(f"--shard {text}: need 0 <= i < N")
    return index, count


def generate(config, shard: str | None = None, thinking: bool | None = None, summary_json: bool = False) -> None:
    """Regenerate the final assistant turn of every prompt (reasoning kept separately)."""
    from rich.console import Console

    from draftsmith.generate.pipeline import generate as run_generate

    if shard is not None:
        config.shard_index, config.shard_count = parse_shard(shard)
    if thinking is not None:  # else the pipeline follows the target's chat template
        config.chat_template_kwargs = {**config.chat_template_kwargs, "enable_thinking": thinking}
    summary = run_generate(config)
    console = Console(stderr=True)
    summary.render(console)
    if summary_json:
        typer.echo(dumps_json(summary.to_dict()))
    if summary.guard_tripped:
        console.print(f"[bold red]draftsmith generate: {summary.stopped_reason}[/]", highlight=False)
        raise typer.Exit(3)
    if not summary.ok:
        for problem in summary.problems():
            console.print(f"[yellow]draftsmith generate: {problem}[/]", highlight=False)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    from draftsmith.generate.config import GenerateConfig

    config_command(app, "generate", GenerateConfig, generate, extras={
        "shard": (str | None, typer.Option(None, help="Process shard i of N (by a stable hash of the sample id), e.g. 0/4.")),
        "thinking": (bool | None, typer.Option(None, "--thinking/--no-thinking", help="chat_template_kwargs.enable_thinking (default: what the target's chat template supports).")),
        "summary_json": (bool, typer.Option(False, "--json", help="Print the summary as JSON on stdout.")),
    })
