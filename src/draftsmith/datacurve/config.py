"""Settings of `draftsmith plan data`: the train recipe (every `train` flag) plus the curve and the plan.

`DataCurveConfig` extends `TrainConfig`, so the recipe a curve is measured with is spelled exactly as
the run it plans: `--drafter`, `--block-size`, `--lr`, `--epochs` ... mean what they mean to `train`.
`--out` is the curve's working directory (one ordinary train run directory per subset and seed);
`--eval-prompts` are the held-out prompts every subset's drafter is measured on; `--epochs` is fixed
across subsets, so a subset twice as large trains twice the steps; `--seed` is the first seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field

from draftsmith.core.config import cli
from draftsmith.train.config import TrainConfig

DEFAULT_FRACTIONS = (0.125, 0.25, 0.5, 1.0)

_CURVE_PANELS = {
    "Data curve": ("sizes", "fractions", "seeds", "eval_limit", "bootstrap", "smoke", "smoke_margin", "plot"),
    "Plan": ("samples", "target_tau", "per_gpu", "throughput", "gpus", "output_mean", "train_gpu", "train_gpus"),
}


class DataCurveConfig(TrainConfig):
    """How much regenerated data a drafter needs: tau measured on nested subsets, fitted, joined to the plan."""

    cli_panels: ClassVar[dict[str, tuple[str, ...]]] = {**TrainConfig.cli_panels, **_CURVE_PANELS}

    sizes: Annotated[list[int] | None, cli(metavar="N,N,...")] = Field(
        None, description="subset sizes in samples, increasing (default: --fractions of the data)")
    fractions: Annotated[list[float], cli(metavar="F,F,...")] = Field(
        list(DEFAULT_FRACTIONS), description="subset sizes as fractions of the data, increasing, each in (0, 1]")
    seeds: int = Field(1, ge=1, le=64, description="drafters trained per subset (seeds --seed, --seed+1, ...)")
    eval_limit: Annotated[int | None, cli(metavar="N")] = Field(
        None, ge=1, le=100_000, description="held-out prompts decoded per drafter (default: all of --eval-prompts)")
    bootstrap: int = Field(200, ge=0, le=10_000, description="bootstrap replicates over prompts and seeds for the interval (0: none)")
    smoke: bool = Field(False, description="only the smallest subset: does the data and recipe work at all (the pass bar)")
    smoke_margin: float = Field(
        0.05, ge=0, le=10, description="the pass bar: trained tau must beat the untrained drafter and prompt lookup by this much")
    plot: bool = Field(True, description="write curve.png (tau against samples, log x) beside curve.json (needs matplotlib)")
    samples: Annotated[str | None, cli(metavar="N")] = Field(
        None, description="the planned dataset size (914k): tau predicted there, and its regeneration and training cost")
    target_tau: Annotated[float | None, cli(metavar="TAU")] = Field(
        None, gt=1, le=1024, description="the tau the team needs: the smallest dataset predicted to reach it")
    per_gpu: Annotated[str | None, cli(metavar="RATE")] = Field(
        None, description="regeneration rate per GPU ('400 tok/s'), as `plan --per-gpu`")
    throughput: Annotated[str | None, cli(metavar="RATE")] = Field(
        None, description="total regeneration rate ('1,600 tok/s'), as `plan --throughput`")
    gpus: int = Field(1, ge=1, le=1_000_000, description="GPUs regenerating (with --per-gpu)")
    output_mean: Annotated[float | None, cli(metavar="TOKENS")] = Field(
        None, gt=0, le=10_000_000, description="output tokens per regenerated sample (default: the data's mean completion)")
    train_gpu: Annotated[str, cli(metavar="TYPE")] = Field("H100", description="GPU type that trains the drafter, as `plan train --gpu`")
    train_gpus: int = Field(1, ge=1, le=100_000, description="GPUs training the drafter together")

    def run_dir(self, size: int, seed: int) -> Path:
        return self.out / "runs" / f"n{size}-seed{seed}"

    def subset_dir(self, size: int) -> Path:
        return self.out / "subsets" / f"n{size}"
