"""PNG histogram of trainable tokens (loss-mask sums) per sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from draftsmith.audit.report import AuditReport


def plot_histogram(report: AuditReport, out: str | Path, bins: int = 60) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = report.trainable_counts
    figure, axis = plt.subplots(figsize=(9, 4.5), dpi=110)
    samples = int(counts.sum())
    if samples:
        top = int(np.flatnonzero(counts)[-1]) + 1
        width = max(1, int(np.ceil(top / bins)))
        starts = np.arange(0, top, width)
        binned = np.add.reduceat(counts[:top], starts)
        axis.bar(starts, binned, width=width, align="edge", color="#4c72b0", edgecolor="white", linewidth=0.3)
        dominant = report.dominant_mask_sum
        if dominant.value is not None and dominant.count:
            share = dominant.count / max(report.samples, 1)
            failed = any(gate.name == "dominant_mask_sum" for gate in report.failed_gates)
            colour = "#c44e52" if failed else "#555555"
            axis.axvline(dominant.value + 0.5 * min(width, 1), color=colour, linestyle="--", linewidth=1)
            axis.annotate(
                f"{share * 100:.1f}% at exactly {dominant.value}",
                xy=(dominant.value, binned.max()),
                xytext=(0.55, 0.9),
                textcoords="axes fraction",
                color=colour,
                arrowprops={"arrowstyle": "->", "color": colour},
            )
    else:
        axis.text(0.5, 0.5, "no readable samples", ha="center", va="center", transform=axis.transAxes)
    axis.set_xlabel(f"trainable {report.length_unit} per sample (loss-mask sum)")
    axis.set_ylabel("samples")
    verdict = "PASS" if report.passed else "FAIL"
    axis.set_title(f"draftsmith audit ({report.input_kind}): {samples:,} samples, {verdict}")
    figure.tight_layout()
    figure.savefig(out, format="png")
    plt.close(figure)
    return out
