"""Learning curves of acceptance against training samples: fit, predict with an interval, invert.

A measured curve is a set of subset sizes n_1 < ... < n_m, each trained with one or more seeds and
evaluated on the same held-out prompts. What is fitted is a saturating power law,

    y(n) = plateau - scale * n ** -exponent        (scale >= 0, exponent > 0, plateau <= upper),

the usual shape of learning curves in sample count. Two ways to predict tau from it:

- "tau": fit tau = 1 + sum_k a_k directly (upper: the block size);
- "positions": fit each draft position's acceptance share a_k(n) (upper: 1), then tau = 1 + sum_k
  a_k(n), with each a_k capped by the one before (a position is accepted only after every earlier one).

Which one predicts better is measured, not assumed: both are fitted on every size but the largest
and judged on the largest (`compare_methods`). The interval is a bootstrap over held-out prompts
(resampled with replacement, the same prompts at every size: they are paired) and seeds (resampled
per size): each replicate refits the curve and predicts; the interval is the replicates' 5th-95th
percentile.

Extrapolation rule: a fit over sizes spanning a factor S = n_max / n_min is taken to support
predictions up to n_max * S (as many doublings beyond the largest size as it measured); beyond that
a prediction is marked unsupported. Any n above n_max is marked extrapolated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# Exponents searched: learning curves in sample count fall between ~0.05 (slow) and ~2 (fast).
# Where points do not fix the exponent (two sizes), a weak pull towards 0.5 picks one.
PRIOR_EXPONENT = 0.5
EXPONENTS = np.unique(np.append(np.geomspace(0.03, 3.0, 160), PRIOR_EXPONENT))
PRIOR_WEIGHT = 1e-3
INTERVAL = (5.0, 95.0)
METHODS = ("tau", "positions")


@dataclass(frozen=True)
class PowerLaw:
    plateau: float
    scale: float
    exponent: float

    def __call__(self, n) -> np.ndarray:
        return self.plateau - self.scale * np.power(np.asarray(n, dtype=float), -self.exponent)

    def to_dict(self) -> dict[str, float]:
        return {"plateau": self.plateau, "scale": self.scale, "exponent": self.exponent}


def fit_power_law(sizes: Sequence[float], values: Sequence[float], upper: float | None = None) -> PowerLaw:
    """Least squares over a grid of exponents, the plateau and scale solved in closed form at each.

    A curve that falls with data gets scale 0 (a flat line at the mean): learning curves do not
    fall, and a fit that says they do would extrapolate to nonsense."""
    n = np.asarray(sizes, dtype=float)
    y = np.asarray(values, dtype=float)
    if n.ndim != 1 or n.shape != y.shape or len(n) < 2:
        raise ValueError("fit_power_law needs at least two (size, value) pairs")
    if np.any(n <= 0) or not np.all(np.isfinite(y)):
        raise ValueError("sizes must be positive and values finite")
    spread = float(np.sum((y - y.mean()) ** 2)) + 1e-12
    best: tuple[float, PowerLaw] | None = None
    for exponent in EXPONENTS:
        x = n ** -exponent
        plateau, scale = _solve(x, y, upper)
        residual = float(np.sum((plateau - scale * x - y) ** 2))
        penalty = PRIOR_WEIGHT * spread * math.log(exponent / PRIOR_EXPONENT) ** 2
        score = residual + penalty
        if best is None or score < best[0]:
            best = (score, PowerLaw(float(plateau), float(scale), float(exponent)))
    assert best is not None
    return best[1]


def _solve(x: np.ndarray, y: np.ndarray, upper: float | None) -> tuple[float, float]:
    """y ~ plateau - scale * x with scale >= 0 and plateau <= upper."""
    x_mean, y_mean = x.mean(), y.mean()
    var = float(np.sum((x - x_mean) ** 2))
    scale = -float(np.sum((x - x_mean) * (y - y_mean))) / var if var > 0 else 0.0
    if scale < 0:
        scale = 0.0
    plateau = y_mean + scale * x_mean
    if upper is not None and plateau > upper:
        plateau = upper
        scale = max(0.0, float(np.sum(x * (plateau - y))) / float(np.sum(x * x)))
    return plateau, scale


@dataclass
class Measurement:
    """One trained drafter's held-out result: per prompt, its cycles and accepted drafts per position."""

    size: int
    seed: int
    cycles: np.ndarray  # [prompts]
    accepted: np.ndarray  # [prompts, positions]: cycles whose draft position k+1 was accepted

    def positions(self, prompts: np.ndarray | None = None) -> np.ndarray:
        cycles, accepted = (self.cycles, self.accepted) if prompts is None else (self.cycles[prompts], self.accepted[prompts])
        total = max(float(cycles.sum()), 1.0)
        return accepted.sum(axis=0) / total


def tau_of_positions(positions: np.ndarray) -> np.ndarray:
    """tau = 1 + sum of the per-position acceptance shares (as engines count it), each capped by the
    position before it. positions: [..., K]."""
    capped = np.minimum.accumulate(np.clip(positions, 0.0, 1.0), axis=-1)
    return 1.0 + capped.sum(axis=-1)


@dataclass
class CurveFit:
    method: str
    sizes: list[int]
    block_size: int
    tau_curve: PowerLaw | None = None
    position_curves: list[PowerLaw] = field(default_factory=list)

    def predict(self, n) -> np.ndarray:
        n = np.atleast_1d(np.asarray(n, dtype=float))
        if self.method == "tau":
            assert self.tau_curve is not None
            return np.clip(self.tau_curve(n), 1.0, float(self.block_size))
        positions = np.stack([curve(n) for curve in self.position_curves], axis=-1)
        return tau_of_positions(positions)

    def plateau(self) -> float:
        return float(self.predict([1e15])[0])

    def to_dict(self) -> dict:
        out = {"method": self.method, "sizes": self.sizes, "plateau": self.plateau()}
        if self.tau_curve is not None:
            out["tau_curve"] = self.tau_curve.to_dict()
        if self.position_curves:
            out["position_curves"] = [curve.to_dict() for curve in self.position_curves]
        return out


def _per_size(measurements: Sequence[Measurement]) -> dict[int, list[Measurement]]:
    grouped: dict[int, list[Measurement]] = {}
    for item in measurements:
        grouped.setdefault(item.size, []).append(item)
    return dict(sorted(grouped.items()))


def fit_curve(method: str, measurements: Sequence[Measurement], block_size: int,
              prompts: np.ndarray | None = None, seed_choice: dict[int, list[int]] | None = None) -> CurveFit:
    """Fit one method on the measurements (optionally a bootstrap's prompts and seeds per size)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    grouped = _per_size(measurements)
    sizes = list(grouped)
    positions = []
    for size, runs in grouped.items():
        chosen = runs if seed_choice is None else [runs[i] for i in seed_choice[size]]
        positions.append(np.mean([run.positions(prompts) for run in chosen], axis=0))
    table = np.asarray(positions)  # [sizes, K]
    fit = CurveFit(method=method, sizes=sizes, block_size=block_size)
    if method == "tau":
        fit.tau_curve = fit_power_law(sizes, tau_of_positions(table), upper=float(block_size))
    else:
        fit.position_curves = [fit_power_law(sizes, table[:, k], upper=1.0) for k in range(table.shape[1])]
    return fit


def measured_tau(measurements: Sequence[Measurement]) -> dict[int, float]:
    """tau per size, averaged over seeds (engine counting, as the fit sees it)."""
    return {size: float(np.mean([tau_of_positions(run.positions()) for run in runs]))
            for size, runs in _per_size(measurements).items()}


@dataclass
class MethodCheck:
    method: str
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return abs(self.predicted - self.measured) / self.measured


def compare_methods(measurements: Sequence[Measurement], block_size: int) -> list[MethodCheck] | None:
    """Each method fitted on all sizes but the largest, judged on the largest; None with < 3 sizes."""
    grouped = _per_size(measurements)
    if len(grouped) < 3:
        return None
    largest = max(grouped)
    earlier = [item for item in measurements if item.size != largest]
    truth = measured_tau(grouped[largest])[largest]
    return [MethodCheck(method, float(fit_curve(method, earlier, block_size).predict([largest])[0]), truth)
            for method in METHODS]


@dataclass
class Prediction:
    n: int
    tau: float
    low: float
    high: float
    extrapolated: bool
    supported: bool

    def to_dict(self) -> dict:
        return {"n": self.n, "tau": self.tau, "low": self.low, "high": self.high,
                "extrapolated": self.extrapolated, "supported": self.supported}


def support_limit(sizes: Sequence[int]) -> float:
    """The largest n the extrapolation rule lets a fit over `sizes` speak for: n_max * (n_max / n_min)."""
    return max(sizes) * (max(sizes) / min(sizes))


def bootstrap_fits(method: str, measurements: Sequence[Measurement], block_size: int, replicates: int = 200,
                   seed: int = 0) -> list[CurveFit]:
    """Refits over prompts (paired across sizes) and seeds (per size) drawn with replacement."""
    grouped = _per_size(measurements)
    prompts = len(next(iter(grouped.values()))[0].cycles)
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(replicates):
        chosen_prompts = rng.integers(0, prompts, size=prompts)
        chosen_seeds = {size: list(rng.integers(0, len(runs), size=len(runs))) for size, runs in grouped.items()}
        fits.append(fit_curve(method, measurements, block_size, chosen_prompts, chosen_seeds))
    return fits


def predict_with_interval(fit: CurveFit, replicas: Sequence[CurveFit], ns: Sequence[int]) -> list[Prediction]:
    ns = [int(n) for n in ns]
    point = fit.predict(ns)
    draws = np.stack([replica.predict(ns) for replica in replicas]) if replicas else point[None, :]
    low, high = np.percentile(draws, INTERVAL, axis=0)
    limit = support_limit(fit.sizes)
    return [Prediction(n=n, tau=float(p), low=float(min(lo, p)), high=float(max(hi, p)),
                       extrapolated=n > max(fit.sizes), supported=n <= limit)
            for n, p, lo, hi in zip(ns, point, low, high)]


def smallest_size_reaching(fit: CurveFit, tau: float, ceiling: float = 1e12) -> int | None:
    """The smallest n whose predicted tau reaches `tau` (bisection on log n; the curve rises), or None."""
    if float(fit.predict([ceiling])[0]) < tau:
        return None
    if float(fit.predict([1])[0]) >= tau:
        return 1
    low, high = 0.0, math.log(ceiling)
    for _ in range(100):
        middle = (low + high) / 2
        if float(fit.predict([math.exp(middle)])[0]) >= tau:
            high = middle
        else:
            low = middle
    return int(math.ceil(math.exp(high)))
