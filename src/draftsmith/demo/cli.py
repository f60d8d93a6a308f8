"""`draftsmith demo`: the main job on the built-in default."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo_command(
        workdir: Path = typer.Option(Path("runs/demo"), help="Where every stage writes its output (replaced)."),
        train_prompts: int = typer.Option(320, min=8, help="Prompts to regenerate and train on."),
        eval_prompts: int = typer.Option(12, min=1, help="Held-out prompts for speculative decoding."),
        train_steps: int = typer.Option(240, min=1, help="Drafter optimizer steps."),
        block_size: int = typer.Option(16, min=2, help="Drafter block size."),
        threads: int = typer.Option(None, help="torch CPU threads (default: torch's choice)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Run every stage end to end on the tiny target that draftsmith builds locally."""
        from rich.console import Console
        from rich.table import Table

        from draftsmith.demo.pipeline import DemoConfig, run_demo

        console = Console(stderr=True)
        result = run_demo(
            DemoConfig(workdir=workdir, train_prompts=train_prompts, eval_prompts=eval_prompts,
                       train_steps=train_steps, block_size=block_size, threads=threads),
            log=lambda message: console.print(message, markup=False, highlight=False),
        )
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=2))
            return
        table = Table(title="draftsmith demo (tiny default target)", show_header=False)
        table.add_row("regenerated samples", f"{result.generated:,} at {result.generate_tokens_per_s:,.0f} output tok/s")
        table.add_row("audit", result.audit_verdict)
        table.add_row("plan: 914k samples at this rate", f"{result.plan_days_for_914k:,.1f} days")
        table.add_row("drafter training", f"loss {result.train_first_loss:.3f} -> {result.train_final_loss:.3f}, "
                                          f"{result.train_steps} steps, {result.train_seconds:.0f}s")
        table.add_row("acceptance length tau", f"{result.tau_trained:.2f} trained vs {result.tau_untrained:.2f} untrained")
        table.add_row("speed-up vs plain decoding", f"{result.speedup_trained:.2f}x (tiny CPU model)")
        table.add_row("greedy output identical", "yes" if result.lossless else "NO")
        table.add_row("serving checkpoint", result.export_dir)
        Console().print(table)
