"""Cross-checking the throughput figures a plan is given, so a unit slip cannot pass silently.

Every figure (a per-GPU rate, a total rate, a bench result, a rate quoted in a doc or chat such as
"5.4M/day") becomes a `RateSource` in cluster tokens per second. The one the plan runs on is
compared with each of the others; when two disagree by more than the tolerance we look for the
reading of the written unit (per second/minute/hour/day/week, or a k/M/B slip) that makes them agree
and say it in so many words: "5.4M/hour matches 1,500 tok/s".
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from draftsmith.core.errors import InputError
from draftsmith.core.units import (
    TIME_UNIT_SECONDS,
    Rate,
    format_count,
    format_tokens_per_s,
    unit_label,
)

DEFAULT_RATE_TOLERANCE = 0.10


class RateSource(BaseModel):
    """One throughput figure, normalised to total (cluster) tokens per second."""

    name: str  # what `use_rate` selects: "bench", "per-gpu", "throughput", "claimed", "claimed-2"
    origin: str  # where it came from, for messages: "--throughput", "bench.json knee"
    text: str  # as the user wrote it
    tokens_per_s: float
    # How the written figure maps to tokens/s, so it can be re-read with another unit.
    amount: float | None = None
    unit: str | None = None
    scale: float = 1.0  # e.g. GPUs x efficiency for a per-GPU figure

    @classmethod
    def from_rate(cls, name: str, origin: str, rate: Rate, scale: float = 1.0) -> "RateSource":
        return cls(
            name=name,
            origin=origin,
            text=rate.text,
            tokens_per_s=rate.tokens_per_s * scale,
            amount=rate.amount,
            unit=rate.unit,
            scale=scale,
        )

    def describe(self) -> str:
        if self.scale != 1.0 and self.unit is not None:
            return f"{self.origin} {self.text!r} (= {format_tokens_per_s(self.tokens_per_s)} in total)"
        if self.unit is not None and self.unit != "second":
            return f"{self.origin} {self.text!r} (= {format_tokens_per_s(self.tokens_per_s)})"
        return f"{self.origin} {format_tokens_per_s(self.tokens_per_s)}"


class Reading(BaseModel):
    """Another way to read a written rate: a different time unit and/or magnitude."""

    text: str
    tokens_per_s: float
    change: str  # "per hour instead of per day", "M instead of k"


class RateCheck(BaseModel):
    reference: str
    other: str
    reference_text: str
    other_text: str
    reference_tokens_per_s: float
    other_tokens_per_s: float
    ratio: float  # other / reference
    agrees: bool
    matching_reading: Reading | None = None
    reading_of: str | None = None  # which source the matching reading re-reads
    message: str


def _readings(source: RateSource) -> list[Reading]:
    """Plausible mis-readings of a written rate, the likeliest slips first."""
    if source.amount is None or source.unit is None:
        return []
    readings: list[Reading] = []
    magnitudes = [(1.0, None), (1e3, "x1000"), (1e-3, "/1000")]
    for factor, magnitude_change in magnitudes:
        for unit, seconds in TIME_UNIT_SECONDS.items():
            if factor == 1.0 and unit == source.unit:
                continue
            amount = source.amount * factor
            changes = []
            if unit != source.unit:
                changes.append(f"per {unit} instead of per {source.unit}")
            if magnitude_change:
                changes.append(f"{format_count(amount)} instead of {format_count(source.amount)}")
            readings.append(
                Reading(
                    text=f"{format_count(amount)}/{unit_label(unit)}",
                    tokens_per_s=amount / seconds * source.scale,
                    change=", ".join(changes),
                )
            )
    return readings


def _relative_gap(a: float, b: float) -> float:
    if a <= 0 or b <= 0:
        return math.inf if a != b else 0.0
    return abs(a - b) / max(a, b)


def compare(reference: RateSource, other: RateSource, tolerance: float = DEFAULT_RATE_TOLERANCE) -> RateCheck:
    ratio = other.tokens_per_s / reference.tokens_per_s if reference.tokens_per_s > 0 else math.inf
    common = dict(
        reference=reference.name,
        other=other.name,
        reference_text=reference.text,
        other_text=other.text,
        reference_tokens_per_s=reference.tokens_per_s,
        other_tokens_per_s=other.tokens_per_s,
        ratio=ratio,
    )
    if _relative_gap(reference.tokens_per_s, other.tokens_per_s) <= tolerance:
        return RateCheck(**common, agrees=True, message=f"{other.describe()} agrees with {reference.describe()}")
    # Re-read the other figure first (a quoted rate is the usual culprit), then the reference.
    best: tuple[float, Reading, RateSource, RateSource] | None = None
    for reread, fixed in ((other, reference), (reference, other)):
        for reading in _readings(reread):
            reading_gap = _relative_gap(reading.tokens_per_s, fixed.tokens_per_s)
            if reading_gap <= tolerance and (best is None or reading_gap < best[0] - 1e-12):
                best = (reading_gap, reading, reread, fixed)
        if best is not None:
            break
    factor = max(ratio, 1 / ratio) if ratio > 0 and math.isfinite(ratio) else math.inf
    direction = "below" if ratio < 1 else "above"
    message = f"{other.describe()} is {_format_factor(factor)} {direction} {reference.describe()}"
    if best is None:
        message += "; no change of time unit or k/M/B reconciles them"
        return RateCheck(**common, agrees=False, message=message)
    _, reading, reread, fixed = best
    message += (
        f"; {reading.text} matches {format_tokens_per_s(fixed.tokens_per_s)}: "
        f"{reread.text!r} looks like a unit slip ({reading.change})"
    )
    return RateCheck(**common, agrees=False, matching_reading=reading, reading_of=reread.name, message=message)


def _format_factor(factor: float) -> str:
    if not math.isfinite(factor):
        return "infinitely"
    return f"{factor:.1f}x" if factor < 10 else f"{factor:.0f}x"


class RateMismatchError(InputError):
    """Two throughput figures disagree and the user has not said which one to trust."""


def choose_rate(
    sources: list[RateSource], use_rate: str | None, tolerance: float = DEFAULT_RATE_TOLERANCE
) -> tuple[RateSource, list[RateCheck]]:
    """Pick the rate to plan on and check every other one against it.

    Without `use_rate`, the first source is the reference and any disagreement raises
    `RateMismatchError`: a plan built on the wrong one of two figures is worse than no plan.
    """
    if not sources:
        raise InputError(
            "no throughput given: pass --per-gpu with --gpus, --throughput, --bench, or a --claimed-rate"
        )
    names = [source.name for source in sources]
    if use_rate is not None:
        matches = [source for source in sources if source.name == use_rate]
        if not matches:
            raise InputError(f"--use-rate {use_rate!r}: no such rate; the rates given are {', '.join(names)}")
        chosen = matches[0]
    else:
        chosen = sources[0]
    checks = [compare(chosen, other, tolerance) for other in sources if other is not chosen]
    disagreements = [check for check in checks if not check.agrees]
    if disagreements and use_rate is None:
        options = " or ".join(
            f"--use-rate {source.name} (plan at {format_tokens_per_s(source.tokens_per_s)})" for source in sources
        )
        details = " | ".join(check.message for check in disagreements)
        raise RateMismatchError(f"rates disagree, refusing to plan: {details}. Fix the unit or pass {options}")
    return chosen, checks
