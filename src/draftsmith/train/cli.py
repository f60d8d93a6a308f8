"""`draftsmith train` and `draftsmith extract`: options from `TrainConfig` / `ExtractConfig`."""

from __future__ import annotations

import os

import typer

from draftsmith.core.config import config_command
from draftsmith.train.config import ExtractConfig, TrainConfig


def train(config: TrainConfig) -> None:
    """Train a DFlash drafter, online (target in the loop) or offline (--offline FEATURES)."""
    from draftsmith.train.trainer import train_drafter

    result = train_drafter(config)
    if int(os.environ.get("RANK", "0")) == 0:
        typer.echo(
            f"trained {result.steps} steps in {result.elapsed_s:.1f}s: loss {result.first_loss:.4f} -> "
            f"{result.final_loss:.4f}, train tau ~{result.train_tau:.2f}; drafter in {result.drafter_dir}"
        )


def extract(config: ExtractConfig) -> None:
    """Dump target hidden-state features to safetensors shards for offline training."""
    from draftsmith.train.extract import extract_features

    extract_features(**config.model_dump(), echo=typer.echo)


def register(app: typer.Typer) -> None:
    config_command(app, "train", TrainConfig, train)
    config_command(app, "extract", ExtractConfig, extract)
