"""`draftsmith plan`: how long regeneration takes, what GPUs and disk it needs, before spending them."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_command(
        config: Path = typer.Option(None, "--config", metavar="FILE", help="YAML or TOML file of plan inputs; flags override it."),
        samples: str = typer.Option(None, "--samples", metavar="N", help="Number of samples to generate (914000, 914k)."),
        output_mean: str = typer.Option(None, "--output-mean", metavar="TOKENS", help="Average output tokens per sample."),
        output_lengths: str = typer.Option(
            None, "--output-lengths", metavar="FILE[:COLUMN]", help="Observed output lengths: FILE[:COLUMN] (JSONL, Parquet, CSV, text)."
        ),
        prompt_mean: str = typer.Option(None, "--prompt-mean", metavar="TOKENS", help="Average prompt tokens per sample."),
        prompt_lengths: str = typer.Option(None, "--prompt-lengths", metavar="FILE[:COLUMN]", help="Observed prompt lengths: FILE[:COLUMN]."),
        max_tokens: str = typer.Option(None, "--max-tokens", metavar="TOKENS", help="Cap on output tokens; truncates the distribution."),
        per_gpu: str = typer.Option(None, "--per-gpu", metavar="RATE", help="Throughput of one GPU/server ('400 tok/s')."),
        gpus: str = typer.Option(None, "--gpus", metavar="N", help="Number of GPUs/servers."),
        efficiency: float = typer.Option(None, "--efficiency", metavar="FRACTION", help="Scaling efficiency beyond one GPU (0-1]."),
        throughput: str = typer.Option(None, "--throughput", metavar="RATE", help="Total throughput ('1,600 tok/s', '5.76M/hour')."),
        bench: Path = typer.Option(None, "--bench", metavar="FILE", help="Saved `draftsmith bench` JSON; its knee is per GPU."),
        claimed_rate: list[str] = typer.Option(
            None, "--claimed-rate", metavar="RATE", help="A rate quoted elsewhere ('5.4M/day'), cross-checked; repeatable."
        ),
        use_rate: str = typer.Option(
            None, "--use-rate", metavar="NAME", help="When rates disagree, the one to plan on: bench, per-gpu, throughput, claimed."
        ),
        rate_tolerance: float = typer.Option(None, "--rate-tolerance", metavar="FRACTION", help="Relative gap two rates may have (0.1)."),
        deadline: str = typer.Option(None, "--deadline", metavar="DURATION", help="Finish within this time ('7d', '36h'): GPUs needed."),
        model_config: Path = typer.Option(None, "--model-config", metavar="PATH", help="Target's config.json (or model dir)."),
        hidden_size: str = typer.Option(None, "--hidden-size", metavar="N", help="Target hidden size (instead of --model-config)."),
        captured_layers: str = typer.Option(None, "--captured-layers", metavar="N", help="Target layers captured (DFlash: 5)."),
        dtype: str = typer.Option(None, "--dtype", metavar="DTYPE", help="Hidden-state dtype on disk (bfloat16); with --train, the target's weights and activations."),
        disk: str = typer.Option(None, "--disk", metavar="SIZE", help="Disk budget for offline hidden states ('90TB', '2 TiB')."),
        as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON instead of tables."),
        train: bool = typer.Option(False, "--train", help="Plan a drafter training run instead: wall time and GPU memory."),
        mean_length: str = typer.Option(None, "--mean-length", metavar="TOKENS", help="--train: mean tokens per sample (prompt + completion)."),
        max_length: str = typer.Option(None, "--max-length", metavar="TOKENS", help="--train: longest sequence; memory is planned for it (3072)."),
        epochs: str = typer.Option(None, "--epochs", metavar="N", help="--train: passes over the data (6)."),
        num_anchors: str = typer.Option(None, "--num-anchors", metavar="N", help="--train: blocks per sequence (512)."),
        block_size: str = typer.Option(None, "--block-size", metavar="B", help="--train: block size (16)."),
        draft_layers: str = typer.Option(None, "--draft-layers", metavar="N", help="--train: drafter layers (5)."),
        batch_size: str = typer.Option(None, "--batch-size", metavar="N", help="--train: sequences per micro-batch per GPU (1)."),
        gpu: str = typer.Option(None, "--gpu", metavar="TYPE", help="--train: GPU type for peak FLOP/s and memory: H100, H200, B200, A100, L40S."),
        gpu_flops: str = typer.Option(None, "--gpu-flops", metavar="FLOPS", help="--train: peak bf16 FLOP/s per GPU ('989T')."),
        gpu_memory: str = typer.Option(None, "--gpu-memory", metavar="SIZE", help="--train: memory per GPU ('80GB')."),
        mfu: float = typer.Option(None, "--mfu", metavar="FRACTION", help="--train: model FLOP utilization (0.35)."),
        offline: bool = typer.Option(None, "--offline/--online", help="--train: from stored features or with the target in the loop."),
        attention: str = typer.Option(None, "--attention", metavar="KIND", help="--train: drafter attention for the headline: sparse or dense."),
        train_bench: Path = typer.Option(None, "--train-bench", metavar="FILE", help="--train: `train --benchmark-steps` JSON; its measured rate."),
    ) -> None:
        """Plan a regeneration run: wall time, rate cross-check, sensitivity, GPUs for a deadline, storage.

        With --train: plan a drafter training run (wall time online/offline, memory per GPU, dense vs sparse attention).
        """
        from draftsmith.plan.capacity import make_plan
        from draftsmith.plan.config import build_inputs
        from draftsmith.plan.report import render_plan

        if train:
            from draftsmith.plan.config import build_train_inputs
            from draftsmith.plan.report import render_train_plan
            from draftsmith.plan.training import make_train_plan

            train_overrides = {
                "samples": samples,
                "mean_length": mean_length,
                "output_mean": output_mean,
                "prompt_mean": prompt_mean,
                "max_length": max_length,
                "epochs": epochs,
                "num_anchors": num_anchors,
                "block_size": block_size,
                "draft_layers": draft_layers,
                "num_features": captured_layers,
                "batch_size": batch_size,
                "gpus": gpus,
                "gpu": gpu,
                "gpu_flops": gpu_flops,
                "gpu_memory": gpu_memory,
                "mfu": mfu,
                "offline": offline,
                "attention": attention,
                "dtype": dtype,
                "model_config_path": str(model_config) if model_config is not None else None,
                "train_bench": str(train_bench) if train_bench is not None else None,
            }
            train_plan = make_train_plan(build_train_inputs(config, train_overrides))
            if as_json:
                typer.echo(json.dumps(train_plan.to_dict(), indent=2))
            else:
                render_train_plan(train_plan)
            return

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
