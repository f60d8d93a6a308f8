"""`draftsmith tokenize`: conversations -> masked Parquet shards, then an audit of what was written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from draftsmith.core.errors import InputError


def _parse_template_args(values: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for value in values:
        key, sep, raw = value.partition("=")
        if not sep or not key:
            raise InputError(f"--template-arg {value!r}: expected KEY=VALUE (VALUE as JSON, e.g. enable_thinking=true)")
        try:
            parsed[key] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key] = raw
    return parsed


def _run_audit(output_dir: Path, tokenizer_path: str, console) -> bool:
    """Audit the shards just written and print the verdict (the tokenizer enables span checks)."""
    from draftsmith.audit import audit_tokenized

    report = audit_tokenized(output_dir, tokenizer=tokenizer_path)
    report.render(console)
    console.print(f"audit: {report.verdict}")
    return bool(report.passed)


def register(app: typer.Typer) -> None:
    @app.command("tokenize")
    def tokenize_command(
        inputs: list[Path] = typer.Argument(..., help="Conversation rows: JSONL/Parquet/Arrow files, dirs of them, or datasets dirs."),
        tokenizer: str = typer.Option(..., "--tokenizer", "-t", help="Target model or tokenizer dir (its chat template is used)."),
        out: Path = typer.Option(..., "--out", "-o", help="Output directory for part-NNNNN.parquet shards."),
        train_turns: str = typer.Option("final", help="Assistant turns to train: final (default) or all."),
        length_policy: str = typer.Option("drop", help="Rows with finish_reason 'length': drop or keep."),
        max_length: int = typer.Option(None, help="Maximum tokens per row."),
        overflow: str = typer.Option("drop", help="Rows longer than --max-length: drop or truncate."),
        verify_share: float = typer.Option(1.0, help="Share of rows whose mask is verified by decoding (0..1)."),
        engine_token_ids: bool = typer.Option(True, help="Use prompt/completion token ids from the engine when present."),
        generation_markers: bool = typer.Option(True, help="Use {% generation %} markers when the template has them."),
        end_of_turn: list[str] = typer.Option([], help="Extra end-of-turn token(s) besides the eos ids."),
        template_arg: list[str] = typer.Option([], help="Chat template kwarg KEY=VALUE (JSON value); repeatable."),
        workers: int = typer.Option(None, min=1, help="Worker processes (default: CPU count)."),
        rows_per_shard: int = typer.Option(10_000, min=1),
        max_error_share: float = typer.Option(0.01, help="Fail when more than this share of rows cannot be masked."),
        overwrite: bool = typer.Option(False, help="Replace shards an earlier run left in --out."),
        resume: bool = typer.Option(False, help="Keep shards an earlier run left in --out and skip their ids."),
        audit: bool = typer.Option(True, help="Audit the written shards afterwards."),
        progress: bool = typer.Option(True, help="Show a progress bar."),
    ) -> None:
        """Apply the target's chat template and build loss masks (1 = assistant tokens to learn)."""
        from pydantic import ValidationError
        from rich.console import Console

        from draftsmith.tokenize.pipeline import TokenizeError, TokenizeOptions, tokenize_dataset

        try:
            options = TokenizeOptions(
                train_turns=train_turns,
                length_policy=length_policy,
                max_length=max_length,
                overflow=overflow,
                verify_share=verify_share,
                use_engine_token_ids=engine_token_ids,
                use_generation_markers=generation_markers,
                end_of_turn_tokens=end_of_turn,
                chat_template_kwargs=_parse_template_args(template_arg),
                workers=workers,
                rows_per_shard=rows_per_shard,
                overwrite=overwrite,
                resume=resume,
                max_error_share=max_error_share,
                progress=progress,
            )
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
                for item in error.errors()
            )
            raise InputError(problems) from None
        console = Console(stderr=True)
        try:
            summary = tokenize_dataset(inputs, tokenizer, out, options)
        except TokenizeError as error:
            if error.summary is not None:
                error.summary.render(console)
            raise
        summary.render(console)
        if audit and not _run_audit(out, tokenizer, console):
            raise typer.Exit(1)
