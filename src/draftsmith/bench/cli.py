"""`draftsmith bench`: a concurrency sweep of one endpoint, saved as contract-3 JSON for `plan`."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.core.errors import InputError


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError(f"--concurrency must be a comma-separated list of integers, got {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise InputError(f"--concurrency needs positive integers, got {text!r}")
    return levels


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench_command(
        prompts: list[Path] = typer.Argument(..., help="Prompt files/dirs (as for generate): real prompts, real lengths."),
        endpoint: str = typer.Option("http://127.0.0.1:8000", "--endpoint", "-e", help="ONE endpoint (= one GPU/server)."),
        out: Path = typer.Option(Path("bench.json"), "--out", "-o", help="Where to write the JSON for `plan`."),
        concurrency: str = typer.Option("1,8,16,32,48,64", help="Comma-separated concurrency levels."),
        requests: int = typer.Option(None, min=1, help="Requests per level (default max(16, 4 x concurrency))."),
        max_tokens: int = typer.Option(2048, min=1),
        temperature: float = typer.Option(0.6),
        top_p: float = typer.Option(0.95),
        thinking: bool = typer.Option(True, "--thinking/--no-thinking"),
        stream: bool = typer.Option(True, "--stream/--no-stream", help="Stream (needed for TTFT)."),
        model: str = typer.Option(None, help="Model name (default: from /v1/models)."),
        engine: str = typer.Option(None, help="Engine name for the JSON (default: /v1/models owned_by)."),
        warmup: bool = typer.Option(True, "--warmup/--no-warmup"),
        knee_tolerance: float = typer.Option(0.1, min=0, max=1, help="Knee: first level within this share of the best."),
        timeout: float = typer.Option(1800.0),
        seed: int = typer.Option(0),
        api_key: str = typer.Option(None, envvar="OPENAI_API_KEY"),
    ) -> None:
        """Sweep concurrency on one endpoint: output tok/s, req/s, latency p50/p99, TTFT, knee."""
        from rich.console import Console

        from draftsmith.bench.sweep import BenchConfig, run_bench

        console = Console(stderr=True)
        config = BenchConfig(
            endpoint=endpoint, prompts=list(prompts), concurrencies=parse_levels(concurrency),
            requests_per_level=requests, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
            chat_template_kwargs={"enable_thinking": thinking}, stream=stream, model=model, engine=engine,
            warmup=warmup, knee_tolerance=knee_tolerance, timeout_s=timeout, seed=seed, api_key=api_key,
        )
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
