"""The audit result: numbers, examples, gates and a one-line verdict, as JSON or a rich table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from draftsmith.audit.checks import CHECK_DESCRIPTIONS, EXAMPLES, GATED_CHECKS, INFO_CHECKS, MIN_COUNTS
from draftsmith.audit.format import distribution_stats, histogram_bins, percent, span_label
from draftsmith.audit.thresholds import Thresholds

__all__ = ["EXAMPLES", "GATED_CHECKS", "INFO_CHECKS", "AuditReport", "Check", "Dominant", "Gate", "duplicate_prompts"]

@dataclass
class Check:
    name: str
    count: int = 0
    example_ids: list[str] = field(default_factory=list)
    #: False when the input cannot answer the question (e.g. no tokenizer for header detection)
    checked: bool = True
    note: str = ""

    def add(self, count: int, ids: list[str] | None = None) -> None:
        self.count += int(count)
        if ids and len(self.example_ids) < EXAMPLES:
            self.example_ids.extend(str(i) for i in ids[: EXAMPLES - len(self.example_ids)])

    def to_dict(self, samples: int) -> dict[str, Any]:
        return {
            "count": self.count,
            "share": _share(self.count, samples),
            "checked": self.checked,
            "example_ids": self.example_ids,
            "description": CHECK_DESCRIPTIONS.get(self.name, ""),
            **({"note": self.note} if self.note else {}),
        }


@dataclass
class Dominant:
    """The most common value and how many samples share it."""

    count: int = 0
    value: int | None = None  # the loss-mask sum, for `mask_sum`
    num_tokens: int | None = None  # span length, for `span`
    text: str | None = None  # decoded span (or the completion text for conversations)
    token_ids: list[int] | None = None
    example_ids: list[str] = field(default_factory=list)
    top: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Gate:
    name: str
    value: float | int | None
    limit: float | int | None
    passed: bool
    skipped: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class AuditReport:
    input_kind: str  # "tokenized" or "conversations"
    paths: list[str]
    samples: int
    bad_samples: int
    length_unit: str  # "tokens" or "chars" (conversations without token counts)
    trainable_counts: np.ndarray  # trainable_counts[k] = samples with exactly k trainable tokens
    sequence_counts: np.ndarray | None
    dominant_mask_sum: Dominant
    dominant_span: Dominant
    checks: dict[str, Check]
    errors: list[str]
    errors_total: int
    thresholds: Thresholds
    settings: dict[str, Any]
    gates: list[Gate] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.gates:
            self.gates = evaluate_gates(self)

    @classmethod
    def from_tally(cls, tally: Any, paths, **fields: Any) -> AuditReport:
        """A report from an audit's running tally (its sample, bad-sample, check and error counts)."""
        return cls(paths=[str(path) for path in paths], samples=tally.samples, bad_samples=tally.bad, checks=tally.checks,
                   errors=tally.errors, errors_total=tally.errors_total, **fields)  # fmt: skip

    # -- results -------------------------------------------------------------------------------
    @property
    def audited_samples(self) -> int:
        return int(self.trainable_counts.sum())

    @property
    def passed(self) -> bool:
        return all(gate.passed for gate in self.gates)

    @property
    def failed_gates(self) -> list[Gate]:
        return [gate for gate in self.gates if not gate.passed]

    @property
    def verdict(self) -> str:
        noun = "tokenized samples" if self.input_kind == "tokenized" else "conversations"
        if self.passed:
            active = sum(not gate.skipped for gate in self.gates)
            stats = distribution_stats(self.trainable_counts)
            median = f", median {stats['p50']} trainable {self.length_unit}" if stats else ""
            return f"PASS: {self.samples:,} {noun} audited, all {active} gates within limits{median}"
        failed = self.failed_gates
        names = ", ".join(gate.name for gate in failed)
        details = "; ".join(gate.message for gate in failed)
        return f"FAIL ({len(failed)} gate{'s' if len(failed) != 1 else ''}: {names}) — {self.samples:,} {noun}: {details}"

    def to_dict(self) -> dict[str, Any]:
        samples = self.samples
        return {
            "kind": "draftsmith.audit",
            "version": 1,
            "input_kind": self.input_kind,
            "paths": self.paths,
            "passed": self.passed,
            "verdict": self.verdict,
            "samples": samples,
            "audited_samples": self.audited_samples,
            "bad_samples": self.bad_samples,
            "length_unit": self.length_unit,
            "trainable": distribution_stats(self.trainable_counts),
            "sequence": distribution_stats(self.sequence_counts) if self.sequence_counts is not None else None,
            "histogram": histogram_bins(self.trainable_counts),
            "dominant": {
                "mask_sum": _dominant_dict(self.dominant_mask_sum, samples),
                "span": _dominant_dict(self.dominant_span, samples),
            },
            "checks": {name: check.to_dict(samples) for name, check in self.checks.items()},
            "gates": [gate.to_dict() for gate in self.gates],
            "errors": self.errors,
            "errors_total": self.errors_total,
            "thresholds": self.thresholds.to_dict(),
            "settings": self.settings,
        }

    def render(self, console) -> None:
        """Print the report as rich tables on `console` (a `rich.console.Console`)."""
        from draftsmith.audit.render import render_report

        render_report(self, console)


def _share(count: int, samples: int) -> float:
    return float(count) / samples if samples else 0.0


def _dominant_dict(dominant: Dominant, samples: int) -> dict[str, Any]:
    out = {
        "count": dominant.count,
        "share": _share(dominant.count, samples),
        "example_ids": dominant.example_ids,
        "top": dominant.top,
    }
    for key in ("value", "num_tokens", "text", "token_ids"):
        value = getattr(dominant, key)
        if value is not None:
            out[key] = value
    return out


def first_repeats(hashes: np.ndarray) -> np.ndarray:
    """True for each entry equal to an earlier one (the first of each value is not a repeat)."""
    repeated = np.ones(len(hashes), dtype=bool)
    if len(hashes):
        repeated[np.unique(hashes, return_index=True)[1]] = False
    return repeated


def duplicate_prompts(prompt_hashes: np.ndarray, completion_hashes: np.ndarray) -> np.ndarray:
    """The `duplicate_prompts` rule of both audits: a row repeats an earlier row's prompt AND
    completion. The same prompt sampled again with another completion is a deliberate sample
    (several answers per prompt), not a duplicate; one completion shared across prompts is
    `duplicate_completions`'s business."""
    prompts = np.asarray(prompt_hashes, dtype=np.uint64)
    completions = np.asarray(completion_hashes, dtype=np.uint64)
    pairs = prompts * np.uint64(0x100000001B3) ^ (completions ^ (completions >> np.uint64(29))) * np.uint64(0xBF58476D1CE4E5B9)
    return first_repeats(pairs)


def evaluate_gates(report: AuditReport) -> list[Gate]:
    thresholds = report.thresholds
    samples = report.samples
    unit = report.length_unit
    gates: list[Gate] = []

    def share_gate(name: str, count: int, checked: bool, describe, min_count: int | None = None) -> None:
        limit = getattr(thresholds, name)
        share = _share(count, samples)
        if limit is None or not checked:
            reason = "off" if limit is None else "not checked"
            gates.append(Gate(name, share, limit, True, True, f"{name}: {reason}"))
            return
        # A dominant value must repeat: in a small set a share says little (one sample of five is 20%).
        rare = share > limit and min_count is not None and count < min_count
        few = "shared by" if name.startswith("dominant") else "seen in"
        note = f"limit {percent(limit)}" + (f"; {few} fewer than {min_count} samples, not a pattern" if rare else "")
        gates.append(Gate(name, share, limit, share <= limit or rare, False, f"{describe(count, share)} ({note})"))

    share_gate(
        "bad_samples",
        report.bad_samples,
        True,
        lambda c, s: f"{percent(s)} of samples ({c:,}) are unreadable",
    )
    mask_sum = report.dominant_mask_sum
    share_gate(
        "dominant_mask_sum",
        mask_sum.count,
        mask_sum.value is not None,
        lambda c, s: f"{percent(s)} of samples ({c:,}) have exactly {mask_sum.value} trainable {unit}",
        thresholds.dominant_min_count,
    )
    span = report.dominant_span
    what = "completion" if report.input_kind == "conversations" else f"{span.num_tokens}-token masked span"
    share_gate(
        "dominant_span",
        span.count,
        span.count > 0,
        lambda c, s: f"{percent(s)} of samples ({c:,}) train on the identical {what} {span_label(span)}",
        thresholds.dominant_min_count,
    )
    for name in GATED_CHECKS:
        check = report.checks.get(name)
        if check is None:
            gates.append(Gate(name, None, getattr(thresholds, name), True, True, f"{name}: not applicable"))
            continue
        description = CHECK_DESCRIPTIONS[name]
        share_gate(
            name,
            check.count,
            check.checked,
            lambda c, s, d=description: f"{percent(s)} of samples ({c:,}): {d}",
            MIN_COUNTS.get(name) and getattr(thresholds, MIN_COUNTS[name]),
        )
    minimum = thresholds.min_samples
    audited = report.audited_samples
    if minimum is None:
        gates.append(Gate("min_samples", audited, None, True, True, "min_samples: off"))
    else:
        gates.append(
            Gate(
                "min_samples",
                audited,
                minimum,
                audited >= minimum,
                False,
                f"only {audited:,} readable samples (need at least {minimum:,})",
            )
        )
    return gates
