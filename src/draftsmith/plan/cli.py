"""`draftsmith plan`: how long regeneration takes, what GPUs and disk it needs, before spending them."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_command(
        config: Path = typer.Option(None, "--config", help="YAML or TOML file of plan inputs; flags override it."),
        samples: str = typer.Option(None, "--samples", help="Number of samples to generate (914000, 914k)."),
        output_mean: str = typer.Option(None, "--output-mean", help="Average output tokens per sample."),
        output_lengths: str = typer.Option(
            None, "--output-lengths", help="Observed output lengths: FILE[:COLUMN] (JSONL, Parquet, CSV, text)."
        ),
        prompt_mean: str = typer.Option(None, "--prompt-mean", help="Average prompt tokens per sample."),
        prompt_lengths: str = typer.Option(None, "--prompt-lengths", help="Observed prompt lengths: FILE[:COLUMN]."),
        max_tokens: str = typer.Option(None, "--max-tokens", help="Cap on output tokens; truncates the distribution."),
        per_gpu: str = typer.Option(None, "--per-gpu", help="Throughput of one GPU/server ('400 tok/s')."),
        gpus: str = typer.Option(None, "--gpus", help="Number of GPUs/servers."),
        efficiency: float = typer.Option(None, "--efficiency", help="Scaling efficiency beyond one GPU (0-1]."),
        throughput: str = typer.Option(None, "--throughput", help="Total throughput ('1,600 tok/s', '5.76M/hour')."),
        bench: Path = typer.Option(None, "--bench", help="Saved `draftsmith bench` JSON; its knee is per GPU."),
        claimed_rate: list[str] = typer.Option(
            None, "--claimed-rate", help="A rate quoted elsewhere ('5.4M/day'), cross-checked; repeatable."
        ),
        use_rate: str = typer.Option(
            None, "--use-rate", help="When rates disagree, the one to plan on: bench, per-gpu, throughput, claimed."
        ),
        rate_tolerance: float = typer.Option(None, "--rate-tolerance", help="Relative gap two rates may have (0.1)."),
        deadline: str = typer.Option(None, "--deadline", help="Finish within this time ('7d', '36h'): GPUs needed."),
        model_config: Path = typer.Option(None, "--model-config", help="Target's config.json (or model dir)."),
        hidden_size: str = typer.Option(None, "--hidden-size", help="Target hidden size (instead of --model-config)."),
        captured_layers: str = typer.Option(None, "--captured-layers", help="Target layers captured (DFlash: 5)."),
        dtype: str = typer.Option(None, "--dtype", help="Hidden-state dtype on disk (bfloat16)."),
        disk: str = typer.Option(None, "--disk", help="Disk budget for offline hidden states ('90TB', '2 TiB')."),
        as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON instead of tables."),
    ) -> None:
        """Plan a regeneration run: wall time, rate cross-check, sensitivity, GPUs for a deadline, storage."""
        from draftsmith.plan.capacity import make_plan
        from draftsmith.plan.config import build_inputs
        from draftsmith.plan.report import render_plan

        overrides = {
            "samples": samples,
            "output_mean": output_mean,
            "output_lengths": output_lengths,
            "prompt_mean": prompt_mean,
            "prompt_lengths": prompt_lengths,
            "max_tokens": max_tokens,
            "per_gpu": per_gpu,
            "gpus": gpus,
            "efficiency": efficiency,
            "throughput": throughput,
            "bench": str(bench) if bench is not None else None,
            "claimed_rates": list(claimed_rate or []),
            "use_rate": use_rate,
            "rate_tolerance": rate_tolerance,
            "deadline": deadline,
            "model_config_path": str(model_config) if model_config is not None else None,
            "hidden_size": hidden_size,
            "captured_layers": captured_layers,
            "dtype": dtype,
            "disk": disk,
        }
        plan = make_plan(build_inputs(config, overrides))
        if as_json:
            typer.echo(json.dumps(plan.to_dict(), indent=2))
        else:
            render_plan(plan)
