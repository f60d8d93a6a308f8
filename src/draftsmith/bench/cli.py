"""`draftsmith bench`: a concurrency sweep of one endpoint, saved as contract-3 JSON for `plan`."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.core.config import config_command


def bench(config, out: Path = Path("bench.json"), thinking: bool | None = None) -> None:
    """Sweep concurrency on one endpoint: output tok/s, req/s, latency p50/p99, TTFT, knee."""
    from rich.console import Console

    from draftsmith.bench.sweep import run_bench
    from draftsmith.core.lock import lock_output_file

    if thinking is not None:
        config.chat_template_kwargs = {**config.chat_template_kwargs, "enable_thinking": thinking}
    console = Console(stderr=True)
    # The output is checked (and held against a second bench) before the sweep, not after it.
    with lock_output_file(out, "bench", flag="--out"):
        result = run_bench(config, log=lambda message: console.print(f"[dim]draftsmith bench:[/] {message}", highlight=False))
        result.render(console)
        path = result.save(out)
    console.print(
        f"knee: concurrency {result.knee['concurrency']} at {result.knee['output_tokens_per_s']:,.0f} output tok/s; "
        f"wrote {path}", highlight=False,
    )
    if result.errors:
        console.print(f"[yellow]draftsmith bench: {result.errors} requests failed during the sweep[/]")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    from draftsmith.bench.config import BenchConfig

    config_command(app, "bench", BenchConfig, bench, extras={
        "out": (Path, typer.Option(Path("bench.json"), "--out", "-o", help="Where to write the JSON for `plan`.")),
        "thinking": (bool | None, typer.Option(None, "--thinking/--no-thinking", help="chat_template_kwargs.enable_thinking (default: what the target's chat template supports).")),
    })
