"""What `plan data` reports: the measured rows, the fitted curve, the plan rows, the smoke verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class CurveRow:
    size: int
    steps: int
    seeds: list[int]
    tau: list[float]  # held-out tau per seed (engine counting: 1 + accepted drafts per step)
    per_position: list[float]  # mean over seeds: share of steps whose draft position k was accepted
    lossless: bool

    @property
    def mean_tau(self) -> float | None:
        return float(np.mean(self.tau)) if self.tau else None


@dataclass
class PlanRow:
    label: str
    n: int
    tau: float
    low: float
    high: float
    measured: float | None
    extrapolated: bool
    supported: bool
    regeneration_days: float | None = None
    regeneration_gpus: int | None = None
    train_gpu_hours: float | None = None


@dataclass
class SmokeVerdict:
    passed: bool
    trained_tau: float
    bars: dict[str, float]
    margin: float
    rising: bool | None
    causes: list[str] = field(default_factory=list)

    def line(self) -> str:
        against = ", ".join(f"{name} {value:.2f}" for name, value in self.bars.items())
        rising = {True: "; acceptance rises with data", False: "; acceptance does NOT rise with data", None: ""}[self.rising]
        verdict = "PASS" if self.passed else "FAIL"
        return f"smoke: {verdict}: trained tau {self.trained_tau:.2f} against {against} (margin {self.margin:g}){rising}"


@dataclass
class DataCurveSummary:
    out: str
    available_samples: int
    sizes: list[int]
    epochs: int
    rows: list[CurveRow]
    baselines: dict[str, float]
    stopped_early: bool
    output_mean: float
    sequence_mean: float
    support_limit: float
    method: str | None = None
    method_reason: str | None = None
    method_checks: list[dict[str, float]] = field(default_factory=list)
    fit: dict[str, Any] | None = None
    plan: list[PlanRow] = field(default_factory=list)
    curve_points: list[dict[str, Any]] = field(default_factory=list)
    target_tau: float | None = None
    target_reached_at: int | None = None
    smoke: SmokeVerdict | None = None
    note: str | None = None
    plot_file: str | None = None

    @property
    def ok(self) -> bool:
        return not self.stopped_early and (self.smoke is None or self.smoke.passed)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = "draftsmith.plan.data"
        data["version"] = 1
        return data

    def render(self, console) -> None:
        from rich.table import Table

        measured = Table(title=f"held-out tau per subset ({self.epochs} epochs each: steps grow with the subset)")
        for column in ("samples", "steps", "seeds", "tau (mean)", "tau per seed", "accept@1", "accept@4", "lossless"):
            measured.add_column(column, justify="right")
        for row in self.rows:
            per = row.per_position
            measured.add_row(f"{row.size:,}", f"{row.steps:,}", str(len(row.tau)),
                             "-" if row.mean_tau is None else f"{row.mean_tau:.2f}", ", ".join(f"{t:.2f}" for t in row.tau),
                             f"{per[0]:.2f}" if per else "-", f"{per[3]:.2f}" if len(per) > 3 else "-", "yes" if row.lossless else "NO")
        console.print(measured)
        if self.baselines:
            console.print("baselines on the same prompts: " + ", ".join(f"{name} tau {value:.2f}" for name, value in self.baselines.items()))
        if self.smoke is not None:
            console.print(self.smoke.line())
            for cause in self.smoke.causes:
                console.print(f"  likely cause: {cause}")
        if self.note:
            console.print(self.note)
        if self.plan:
            console.print(f"fit: {self.method} ({self.method_reason}); plateau tau {self.fit['plateau']:.2f}" if self.fit else "")
            table = Table(title="predicted tau (90% interval: bootstrap over prompts and seeds) and what each size costs")
            for column in ("", "samples", "tau", "interval", "measured", "regeneration", "training GPU-h", "note"):
                table.add_column(column, justify="right")
            for row in self.plan:
                regen = "-" if row.regeneration_days is None else (
                    _duration(row.regeneration_days) + (f" on {row.regeneration_gpus} GPUs" if row.regeneration_gpus else ""))
                hours = "-" if row.train_gpu_hours is None else f"{row.train_gpu_hours:,.3g}"
                note = "" if not row.extrapolated else (
                    f"extrapolated x{row.n / max(self.sizes):,.1f}" + ("" if row.supported else ": beyond what the fit supports"))
                table.add_row(row.label, f"{row.n:,}", f"{row.tau:.2f}", f"{row.low:.2f}-{row.high:.2f}",
                              "-" if row.measured is None else f"{row.measured:.2f}", regen, hours, note)
            console.print(table)
            if self.target_tau is not None and self.target_reached_at is None:
                console.print(f"--target-tau {self.target_tau:g}: not reached at any size by the fitted curve (plateau "
                              f"{self.fit['plateau']:.2f}): more of this data will not get there; change the recipe or the data")
            console.print(f"extrapolation rule: sizes measured over a x{max(self.sizes) / min(self.sizes):,.0f} span support "
                          f"predictions up to {self.support_limit:,.0f} samples (as many doublings past the largest as measured)")
        if self.plot_file:
            console.print(f"plot: {self.plot_file}")


def _duration(days: float) -> str:
    if days >= 1:
        return f"{days:,.1f} days"
    return f"{days * 24:.1f} h" if days * 24 >= 1 else f"{days * 1440:.1f} min"


def write_plot(summary: DataCurveSummary, path: Path) -> Path:
    """tau against samples (log x): measured points per seed, the fitted curve and its band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    if summary.curve_points:
        ns = [p["n"] for p in summary.curve_points]
        axes.fill_between(ns, [p["low"] for p in summary.curve_points], [p["high"] for p in summary.curve_points],
                          alpha=0.25, label="90% interval")
        axes.plot(ns, [p["tau"] for p in summary.curve_points], label=f"fit ({summary.method})")
        axes.axvline(summary.support_limit, linestyle=":", color="grey", label="extrapolation limit")
    for row in summary.rows:
        axes.scatter([row.size] * len(row.tau), row.tau, color="black", zorder=3)
    for color, (name, value) in zip(("C2", "C3", "C4"), summary.baselines.items()):
        axes.axhline(value, linestyle="--", linewidth=1, color=color, label=f"{name} (tau {value:.2f})")
    axes.set_xscale("log")
    axes.set_xlabel("training samples")
    axes.set_ylabel("held-out tau")
    axes.legend(fontsize=8)
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
