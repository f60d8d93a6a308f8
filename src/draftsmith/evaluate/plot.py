"""`eval --plot FILE.png`: the acceptance-length histogram and per-position acceptance of an eval."""

from __future__ import annotations

from pathlib import Path

from draftsmith.core.io import atomic_path
from draftsmith.evaluate.speculative import EvalReport, per_position_acceptance


def plot_eval_report(report: EvalReport, path: str | Path) -> Path:
    """Draw the two panels to `path` (PNG, written atomically); returns the path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers, and no GUI backend to pick up
    import matplotlib.pyplot as plt

    path = Path(path)
    block = report.max_tau  # the most one cycle commits: DSpark's block + 1
    total = max(1, sum(report.acceptance_histogram.values()))
    lengths = list(range(1, block + 1))
    shares = [report.acceptance_histogram.get(length, 0) / total for length in lengths]
    positions = list(range(1, block))
    accepted = report.per_position_acceptance or per_position_acceptance(report.acceptance_histogram, block)

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    left.bar(lengths, shares, color="#4C72B0")
    left.axvline(report.tau, color="#C44E52", linestyle="--", label=f"tau = {report.tau:.2f}")
    left.set_xlabel("tokens committed per cycle (acceptance length)")
    left.set_ylabel("share of cycles")
    left.set_xticks(lengths)
    left.set_title(f"Acceptance length ({report.total_cycles:,} cycles, block {block})")
    left.legend()
    right.plot(positions, accepted, marker="o", color="#55A868")
    right.set_ylim(0, 1.02)
    right.set_xticks(positions)
    right.set_xlabel("draft position k")
    right.set_ylabel("share of cycles with position k accepted")
    right.set_title("Per-position acceptance")
    right.grid(alpha=0.3)
    figure.suptitle(
        f"{report.num_prompts} prompts, {report.total_new_tokens:,} new tokens, speed-up {report.speedup:.2f}x, "
        + ("lossless" if report.lossless else "NOT lossless")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(path) as temporary:
            figure.savefig(temporary, format="png", dpi=110)
    finally:
        plt.close(figure)
    return path
