"""`draftsmith generate`: the CLI over ``draftsmith.generate.generate``.

Exit codes: 0 all samples done; 1 some failed or remain (rerun to resume / see the failures file);
2 bad input; 3 the quality guard stopped the run; 130 interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from draftsmith.core.errors import InputError


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


def parse_json_object(text: str | None, flag: str) -> dict:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{flag}: not valid JSON ({error.msg})") from None
    if not isinstance(value, dict):
        raise InputError(f"{flag}: must be a JSON object")
    return value


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate_command(
        inputs: list[Path] = typer.Argument(..., help="Prompt files/dirs: JSONL, JSON, Parquet or a saved HF dataset."),
        output: Path = typer.Option(..., "--output", "-o", help="Output directory (append-only shards; resumable)."),
        endpoint: list[str] = typer.Option(
            ["http://127.0.0.1:8000"], "--endpoint", "-e", help="OpenAI-compatible base URL; repeat for more GPUs/nodes."
        ),
        model: str = typer.Option(None, help="Model name for requests (default: from /v1/models)."),
        max_tokens: int = typer.Option(4096, min=1),
        temperature: float = typer.Option(0.6),
        top_p: float = typer.Option(0.95),
        seed: int = typer.Option(None),
        thinking: bool = typer.Option(True, "--thinking/--no-thinking", help="chat_template_kwargs.enable_thinking."),
        chat_template_kwargs: str = typer.Option(None, help="Extra chat_template_kwargs as JSON."),
        extra_body: str = typer.Option(None, help="Extra request fields as JSON, e.g. '{\"top_k\": 20}'."),
        concurrency: int = typer.Option(32, min=1, help="Requests in flight per endpoint."),
        stream: bool = typer.Option(False, help="Stream responses (SSE)."),
        token_ids: bool = typer.Option(True, "--token-ids/--no-token-ids", help="Ask for token ids (vLLM return_token_ids)."),
        shard: str = typer.Option("0/1", help="Process shard i of N (by a stable hash of the sample id)."),
        order: str = typer.Option("input", help="input | longest-first | prefix"),
        limit: int = typer.Option(None, min=1, help="Attempt at most this many samples this run."),
        retry_failed: bool = typer.Option(True, "--retry-failed/--skip-failed", help="Retry an earlier run's failures."),
        max_retries: int = typer.Option(5, min=0),
        timeout: float = typer.Option(1800.0, help="Per-request timeout in seconds."),
        health_interval: float = typer.Option(10.0, help="Seconds between endpoint health checks."),
        endpoint_wait: float = typer.Option(600.0, help="Seconds to wait with no healthy endpoint before stopping."),
        guard: bool = typer.Option(True, "--guard/--no-guard", help="Run the quality guard."),
        guard_window: int = typer.Option(200, min=1),
        guard_min_samples: int = typer.Option(50, min=1),
        max_empty_answer: float = typer.Option(0.2, min=0, max=1),
        max_empty_reasoning: float = typer.Option(0.5, min=0, max=1),
        max_boilerplate: float = typer.Option(0.5, min=0, max=1),
        max_length_finish: float = typer.Option(0.3, min=0, max=1),
        progress: bool = typer.Option(True, "--progress/--no-progress"),
        api_key: str = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer token, if the engine needs one."),
        summary_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    ) -> None:
        """Regenerate the final assistant turn of every prompt (reasoning kept separately)."""
        from rich.console import Console

        from draftsmith.generate.guard import GuardConfig
        from draftsmith.generate.pipeline import GenerateConfig, generate

        shard_index, shard_count = parse_shard(shard)
        template_kwargs = {"enable_thinking": thinking, **parse_json_object(chat_template_kwargs, "--chat-template-kwargs")}
        config = GenerateConfig(
            inputs=list(inputs),
            output_dir=output,
            endpoints=list(endpoint),
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            chat_template_kwargs=template_kwargs,
            extra_body=parse_json_object(extra_body, "--extra-body"),
            concurrency=concurrency,
            stream=stream,
            return_token_ids=token_ids,
            shard_index=shard_index,
            shard_count=shard_count,
            order=order,
            limit=limit,
            retry_failed=retry_failed,
            max_retries=max_retries,
            request_timeout_s=timeout,
            health_interval_s=health_interval,
            endpoint_wait_s=endpoint_wait,
            guard=GuardConfig(
                enabled=guard,
                window=guard_window,
                min_samples=guard_min_samples,
                max_empty_answer=max_empty_answer,
                max_empty_reasoning=max_empty_reasoning,
                max_boilerplate=max_boilerplate,
                max_length_finish=max_length_finish,
            ),
            progress=progress,
            api_key=api_key,
        )
        summary = generate(config)
        console = Console(stderr=True)
        summary.render(console)
        if summary_json:
            typer.echo(json.dumps(summary.to_dict(), indent=2))
        if summary.guard_tripped:
            console.print(f"[bold red]draftsmith generate: {summary.stopped_reason}[/]", highlight=False)
            raise typer.Exit(3)
        if not summary.ok:
            for problem in summary.problems():
                console.print(f"[yellow]draftsmith generate: {problem}[/]", highlight=False)
            raise typer.Exit(1)
