"""`draftsmith serve`: run the local OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path

import typer

from draftsmith.core.errors import InputError


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_command(
        model: Path = typer.Option(None, "--model", help="Hugging Face model directory (the 'model' backend)."),
        backend: str = typer.Option(None, help="'model' or 'echo' (default: 'model' with --model, else 'echo')."),
        tiny: bool = typer.Option(False, help="Serve the built-in tiny target (built or reused from the cache)."),
        host: str = typer.Option("127.0.0.1"),
        port: int = typer.Option(8000, help="Port (0: pick a free one; the bound port is printed)."),
        served_model_name: str = typer.Option(None, help="Model name reported by the API."),
        reasoning_field: str = typer.Option(
            "reasoning_content", help="reasoning_content (SGLang/llama-server), reasoning (vLLM) or inline (<think> in content)."
        ),
        max_batch_size: int = typer.Option(16, min=1, help="Most concurrent requests decoded in one batch."),
        batch_wait_ms: float = typer.Option(5.0, min=0, help="How long a forming batch waits for more requests."),
        echo_answer: str = typer.Option("The answer to {prompt}", help="Echo backend answer template."),
        echo_reasoning: str = typer.Option("Let me think about {prompt}", help="Echo backend reasoning template ('' for none)."),
        fail_rate: float = typer.Option(0.0, min=0, max=1, help="Fault injection: share of requests failed with --fail-status."),
        fail_status: int = typer.Option(503, help="HTTP status of injected failures (e.g. 503, 429, 400)."),
        fail_first: int = typer.Option(0, min=0, help="Fault injection: fail the first N requests."),
        drop_rate: float = typer.Option(0.0, min=0, max=1, help="Fault injection: share of connections dropped without a response."),
        delay: float = typer.Option(0.0, min=0, help="Fault injection: seconds added before every completion."),
        die_after: int = typer.Option(0, min=0, help="Fault injection: hard-exit when this many requests have arrived."),
        unhealthy: bool = typer.Option(False, help="Fault injection: /health answers 503."),
        seed: int = typer.Option(0, help="Seed of the fault-injection RNG."),
        workers: int = typer.Option(1, min=1, help="Echo backend only: pre-forked processes sharing the port."),
    ) -> None:
        """Serve an OpenAI-compatible API (chat completions, /health, /v1/models) on HOST:PORT.

        Not an inference engine: for demos, tests and client benchmarks. Use vLLM, SGLang or
        llama-server for real generation.
        """
        from draftsmith.serve.server import REASONING_FIELDS, FaultConfig, ServeConfig, run_server

        if tiny:
            from draftsmith.tiny import build_tiny_target

            model = build_tiny_target(log=lambda m: typer.echo(m, err=True))
            served_model_name = served_model_name or "tiny"
        chosen = backend or ("model" if model is not None else "echo")
        if chosen not in ("model", "echo"):
            raise InputError(f"--backend must be 'model' or 'echo', got {chosen!r}")
        if chosen == "model":
            if model is None:
                raise InputError("--backend model needs --model DIR (or --tiny)")
            if not (Path(model) / "config.json").is_file():
                raise InputError(f"--model {model}: no config.json there (not a Hugging Face model directory)")
        if reasoning_field not in REASONING_FIELDS:
            raise InputError(f"--reasoning-field must be one of {', '.join(REASONING_FIELDS)}, got {reasoning_field!r}")
        config = ServeConfig(
            backend=chosen,
            model_dir=model,
            served_model_name=served_model_name,
            host=host,
            port=port,
            reasoning_field=reasoning_field,
            max_batch_size=max_batch_size,
            batch_wait_s=batch_wait_ms / 1000.0,
            echo_answer=echo_answer,
            echo_reasoning=echo_reasoning,
            faults=FaultConfig(
                fail_rate=fail_rate,
                fail_status=fail_status,
                fail_first=fail_first,
                drop_rate=drop_rate,
                delay_s=delay,
                die_after=die_after,
                unhealthy=unhealthy,
                seed=seed,
            ),
        )
        if workers > 1 and chosen != "echo":
            raise InputError("--workers > 1 is only for the echo backend")
        run_server(config, workers=workers)
