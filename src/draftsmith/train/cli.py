"""`draftsmith train` and `draftsmith extract`: options from `TrainConfig` / `ExtractConfig`."""

from __future__ import annotations

import os

import typer

from draftsmith.core.config import config_command
from draftsmith.train.config import ExtractConfig, TrainConfig


def train(config: TrainConfig) -> None:
    """Train a DFlash drafter, online (target in the loop) or offline (--offline FEATURES)."""
    if config.benchmark_steps:
        from draftsmith.train.benchmark import BENCHMARK_FILE, benchmark_training

        bench = benchmark_training(config)
        if int(os.environ.get("RANK", "0")) == 0:
            typer.echo(
                f"{bench['steps']} steps in {bench['seconds']:.2f}s on {bench['device']} x {bench['world_size']}: "
                f"{bench['steps_per_s']:.3f} steps/s, {bench['tokens_per_s']:,.0f} tok/s, {bench['samples_per_s']:.3f} samples/s, "
                f"peak memory {bench['peak_memory_bytes'] / 2**30:.2f} GiB; wrote {config.out / BENCHMARK_FILE}"
            )
        return
    from draftsmith.train.trainer import train_drafter

    result = train_drafter(config)
    if int(os.environ.get("RANK", "0")) == 0 and result.extra.get("already_finished"):
        typer.echo(f"already finished: {result.steps} steps, loss {result.first_loss:.4f} -> {result.final_loss:.4f}, "
                   f"train tau ~{result.train_tau:.2f}; drafter in {result.drafter_dir}")
    elif int(os.environ.get("RANK", "0")) == 0:
        typer.echo(
            f"trained {result.steps} steps in {result.elapsed_s:.1f}s: loss {result.first_loss:.4f} -> "
            f"{result.final_loss:.4f}, train tau ~{result.train_tau:.2f}, anchor coverage {result.anchor_coverage:.1%}; "
            f"drafter in {result.drafter_dir}"
        )


def extract(config: ExtractConfig) -> None:
    """Dump target hidden-state features to safetensors shards for offline training."""
    from draftsmith.train.extract import extract_features

    extract_features(**config.model_dump(), echo=typer.echo)


def register(app: typer.Typer) -> None:
    config_command(app, "train", TrainConfig, train)
    config_command(app, "extract", ExtractConfig, extract)
