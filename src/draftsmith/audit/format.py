"""Numbers and text for the audit report and its rendering: shares, distributions, span labels."""

from __future__ import annotations

from typing import Any

import numpy as np


def distribution_stats(counts: np.ndarray | None) -> dict[str, Any] | None:
    """min/percentiles/max/mean from a dense histogram `counts[value] = samples`."""
    if counts is None:
        return None
    total = int(counts.sum())
    if total == 0:
        return None
    values = np.flatnonzero(counts)
    cumulative = np.cumsum(counts)

    def percentile(q: float) -> int:
        return int(np.searchsorted(cumulative, q * total, side="left"))

    weighted = float((np.arange(len(counts), dtype=np.float64) * counts).sum())
    return {
        "min": int(values[0]),
        "p10": percentile(0.10),
        "p50": percentile(0.50),
        "p90": percentile(0.90),
        "p99": percentile(0.99),
        "max": int(values[-1]),
        "mean": weighted / total,
        "total": int(weighted),
    }


def histogram_bins(counts: np.ndarray, bins: int = 40) -> dict[str, list]:
    """A coarse equal-width histogram of a dense count array (for JSON and the plot)."""
    total = int(counts.sum())
    if total == 0:
        return {"edges": [], "counts": []}
    top = int(np.flatnonzero(counts)[-1]) + 1
    width = max(1, int(np.ceil(top / bins)))
    edges = np.arange(0, top + width, width)
    padded = np.zeros(len(edges) - 1, dtype=np.int64)
    binned = np.add.reduceat(counts[:top], np.arange(0, top, width)) if top else np.zeros(0)
    padded[: len(binned)] = binned
    return {"edges": [int(e) for e in edges], "counts": [int(c) for c in padded]}


def percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def span_label(dominant, limit: int = 60) -> str:
    """The decoded span, or its first token ids when there is no tokenizer to decode them."""
    if dominant.text is not None:
        return "'" + shorten(dominant.text, limit) + "'"
    if dominant.token_ids:
        ids = " ".join(map(str, dominant.token_ids[:12]))
        return f"[token ids {ids}{' …' if len(dominant.token_ids) > 12 else ''}]"
    return "(text not kept)"


def shorten(text: str | None, limit: int = 80) -> str:
    if text is None:
        return ""
    text = repr(text)[1:-1]
    return text if len(text) <= limit else text[: limit - 1] + "…"
