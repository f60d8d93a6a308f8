"""`draftsmith demo`: the main job on the built-in default."""

from __future__ import annotations

import typer

from draftsmith.core.config import config_command
from draftsmith.core.io import dumps_json


def demo(config, as_json: bool = False) -> None:
    """Run every stage end to end on the tiny target draftsmith builds locally, or on a real one (--target)."""
    from rich.console import Console
    from rich.table import Table

    from draftsmith.demo.pipeline import run_demo

    console = Console(stderr=True)
    result = run_demo(config, log=lambda message: console.print(message, markup=False, highlight=False))
    if as_json:
        typer.echo(dumps_json(result.to_dict()))
        return
    title = "tiny default target" if config.target == "tiny" else f"real target {config.target}"
    table = Table(title=f"draftsmith demo ({title})", show_header=False)
    table.add_row("regenerated samples", f"{result.generated:,} at {result.generate_tokens_per_s:,.0f} output tok/s")
    table.add_row("audit", result.audit_verdict)
    table.add_row("plan: 914k samples x 2,500 tokens, 1 GPU at this rate", f"{result.plan_days_for_914k:,.1f} days")
    table.add_row("drafter training", f"loss {result.train_first_loss:.3f} -> {result.train_final_loss:.3f}, "
                                      f"{result.train_steps} steps, {result.train_seconds:.0f}s")
    table.add_row("acceptance length tau", f"{result.tau_trained:.2f} trained vs {result.tau_untrained:.2f} untrained")
    table.add_row("speed-up vs plain decoding", f"{result.speedup_trained:.2f}x (CPU, in-process)")
    table.add_row("greedy output identical", "yes" if result.lossless else "NO")
    table.add_row("serving checkpoint", result.export_dir)
    Console().print(table)


def register(app: typer.Typer) -> None:
    from draftsmith.demo.config import DemoConfig

    config_command(app, "demo", DemoConfig, demo, extras={
        "as_json": (bool, typer.Option(False, "--json", help="Print the result as JSON.")),
    })
