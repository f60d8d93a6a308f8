"""`draftsmith eval`: speculative decoding with a drafter vs plain greedy decoding of its target."""

from __future__ import annotations

import json

import typer

from draftsmith.core.config import config_command
from draftsmith.evaluate.config import EvalConfig


def evaluate(config: EvalConfig, as_json: bool = False) -> None:
    """Run real speculative decoding; report tau, acceptance histogram, tokens/s and losslessness."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from draftsmith.core.config import torch_dtype
    from draftsmith.core.io import write_atomic
    from draftsmith.evaluate.speculative import LosslessnessError, _mismatch_message, evaluate_drafter

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    err = Console(stderr=True)
    with Progress(
        TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err, transient=True
    ) as bar:
        task = bar.add_task("eval", total=None)
        report = evaluate_drafter(
            config.target,
            config.drafter,
            config.prompts,
            max_new_tokens=config.max_new_tokens,
            block_size=config.block_size,
            limit=config.limit,
            enable_thinking=config.thinking,
            dtype=torch_dtype(config.dtype),
            strict=False,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    if config.out is not None:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(config.out, report.to_json() + "\n")
    if config.plot is not None:
        from draftsmith.evaluate.plot import plot_eval_report

        plot_eval_report(report, config.plot)
        err.print(f"plot written to {config.plot}")
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        report.render(Console())
        typer.echo(report.verdict)
    if not report.lossless:
        raise LosslessnessError(_mismatch_message(report))


def register(app: typer.Typer) -> None:
    config_command(app, "eval", EvalConfig, evaluate, extras={
        "as_json": (bool, typer.Option(False, "--json", help="Print the JSON report instead of tables.")),
    })
