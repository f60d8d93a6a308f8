"""`draftsmith serve`: run the local OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.core.config import config_command
from draftsmith.core.errors import InputError


def serve(config, tiny: bool = False, batch_wait_ms: float | None = None, workers: int = 1) -> None:
    """Serve an OpenAI-compatible API (chat completions, /health, /v1/models) on HOST:PORT.

    Not an inference engine: for demos, tests and client benchmarks. Use vLLM, SGLang or
    llama-server for real generation.
    """
    from draftsmith.serve.server import run_server

    if tiny:
        from draftsmith.tiny import build_tiny_target

        config.model_dir = build_tiny_target(log=lambda m: typer.echo(m, err=True))
        config.served_model_name = config.served_model_name or "tiny"
        config.backend = "model"
    if batch_wait_ms is not None:
        config.batch_wait_s = batch_wait_ms / 1000.0
    if config.backend == "model":
        if config.model_dir is None:
            raise InputError("--backend model needs --model DIR (or --tiny)")
        if not (Path(config.model_dir) / "config.json").is_file():
            raise InputError(f"--model {config.model_dir}: no config.json there (not a Hugging Face model directory)")
    if workers > 1 and config.backend != "echo":
        raise InputError("--workers > 1 is only for the echo backend")
    run_server(config, workers=workers)


def register(app: typer.Typer) -> None:
    from draftsmith.serve.config import ServeConfig

    config_command(app, "serve", ServeConfig, serve, extras={
        "tiny": (bool, typer.Option(False, help="Serve the built-in tiny target (built or reused from the cache).")),
        "batch_wait_ms": (float | None, typer.Option(None, min=0, help="How long a forming batch waits for more requests (ms; default 5).")),
        "workers": (int, typer.Option(1, min=1, help="Echo backend only: pre-forked processes sharing the port.")),
    })
