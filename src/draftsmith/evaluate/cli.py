"""`draftsmith eval`: speculative decoding with a drafter vs plain greedy decoding of its target."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_command(
        target: Path = typer.Option(..., help="Target model directory (Hugging Face format, with tokenizer)."),
        drafter: Path = typer.Option(..., help="Drafter checkpoint directory (config.json + model.safetensors)."),
        prompts: Path = typer.Option(..., help="Prompts: JSONL/JSON/Parquet rows with messages, conversations or prompt."),
        max_new_tokens: int = typer.Option(256, min=1, help="Tokens to generate per prompt."),
        limit: int = typer.Option(None, min=1, help="Evaluate only the first N prompts."),
        block_size: int = typer.Option(None, min=2, help="Draft block size (default: the drafter's)."),
        thinking: bool = typer.Option(None, "--thinking/--no-thinking", help="Pass enable_thinking to the chat template."),
        dtype: str = typer.Option("float32", help="float32 or bfloat16 for target and drafter."),
        out: Path = typer.Option(None, help="Also write the JSON report to this file."),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON report instead of tables."),
        threads: int = typer.Option(None, min=1, help="torch CPU threads (1 is fastest for tiny models on busy machines)."),
        plot: Path = typer.Option(
            None, "--plot", metavar="FILE.png", help="Also draw the acceptance-length histogram and per-position acceptance to this PNG."
        ),
    ) -> None:
        """Run real speculative decoding; report tau, acceptance histogram, tokens/s and losslessness."""
        import torch
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from draftsmith.core.errors import InputError
        from draftsmith.evaluate.speculative import LosslessnessError, _mismatch_message, evaluate_drafter

        if threads is not None:
            torch.set_num_threads(threads)
        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
        if dtype not in dtypes:
            raise InputError(f"--dtype must be one of {sorted(dtypes)}, got {dtype!r}")
        if plot is not None and plot.suffix.lower() != ".png":
            raise InputError(f"--plot {plot}: the plot is a PNG; give a file name ending in .png")
        err = Console(stderr=True)
        with Progress(
            TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err, transient=True
        ) as bar:
            task = bar.add_task("eval", total=None)
            report = evaluate_drafter(
                target,
                drafter,
                prompts,
                max_new_tokens=max_new_tokens,
                block_size=block_size,
                limit=limit,
                enable_thinking=thinking,
                dtype=dtypes[dtype],
                strict=False,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(report.to_json() + "\n")
            tmp.replace(out)
        if plot is not None:
            from draftsmith.evaluate.plot import plot_eval_report

            plot_eval_report(report, plot)
            err.print(f"plot written to {plot}")
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            report.render(Console())
            typer.echo(report.verdict)
        if not report.lossless:
            raise LosslessnessError(_mismatch_message(report))
