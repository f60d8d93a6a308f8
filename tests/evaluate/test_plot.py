"""`eval --plot`: per-position acceptance from the histogram, and a real PNG from a real eval."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from draftsmith.cli import main
from draftsmith.evaluate.plot import plot_eval_report
from draftsmith.evaluate.speculative import EvalReport, per_position_acceptance
from draftsmith.model import DFlashDraftModel, build_drafter_config, save_drafter
from draftsmith.tiny import synthetic_prompts

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _report(histogram: dict[int, int], block: int = 8) -> EvalReport:
    cycles = sum(histogram.values())
    return EvalReport(
        tau=sum(k * v for k, v in histogram.items()) / cycles, acceptance_histogram=histogram, block_size=block,
        num_prompts=2, total_new_tokens=sum(k * v for k, v in histogram.items()), total_cycles=cycles,
        speculative_tokens_per_s=30.0, target_tokens_per_s=20.0, speedup=1.5, lossless=True, mismatched_prompts=[],
        max_new_tokens=64, per_prompt=[], per_position_acceptance=per_position_acceptance(histogram, block),
    )


def test_per_position_acceptance_counts_cycles_reaching_each_position():
    histogram = {1: 2, 3: 1, 8: 1}
    rates = per_position_acceptance(histogram, 8)
    assert rates == [0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25]
    tau = (2 * 1 + 3 + 8) / 4
    assert sum(rates) == pytest.approx(tau - 1)  # each accepted draft position adds one token to the bonus
    assert per_position_acceptance({}, 4) == [0.0, 0.0, 0.0]


def test_plot_is_a_real_png_with_both_panels(tmp_path):
    import matplotlib.image

    path = plot_eval_report(_report({1: 40, 2: 25, 3: 15, 4: 10, 6: 6, 8: 4}), tmp_path / "plots" / "eval.png")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 20_000
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 400 and image.shape[1] > 1000
    # Bars, the tau line and the curve are drawn in their own colours, not just axes on white.
    colours = {tuple(np.round(pixel[:3], 2)) for pixel in image.reshape(-1, image.shape[-1])[::7]}
    assert len(colours) > 50
    assert [p.name for p in path.parent.iterdir()] == ["eval.png"]  # no temporary left behind


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, tiny_target_dir):
    from transformers import AutoConfig

    config = build_drafter_config(AutoConfig.from_pretrained(tiny_target_dir), num_draft_layers=1, block_size=8, mask_token_id=3)
    torch.manual_seed(0)
    return save_drafter(DFlashDraftModel(config).eval(), tmp_path_factory.mktemp("drafter") / "drafter")


def test_cli_eval_plot_from_a_real_eval(tmp_path, tiny_target_dir, drafter_dir, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(2, seed=3)))
    plot = tmp_path / "eval.png"
    code = main(["eval", "--target", str(tiny_target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts),
                 "--max-new-tokens", "16", "--json", "--threads", "1", "--plot", str(plot)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    rates = report["per_position_acceptance"]
    assert len(rates) == 7 and all(0 <= r <= 1 for r in rates)
    assert sum(rates) == pytest.approx(report["tau"] - 1)
    assert plot.read_bytes().startswith(PNG_SIGNATURE) and plot.stat().st_size > 20_000


def test_cli_eval_plot_must_be_png(tmp_path, tiny_target_dir, drafter_dir, capsys):
    code = main(["eval", "--target", str(tiny_target_dir), "--drafter", str(drafter_dir), "--prompts", str(tmp_path / "p.jsonl"),
                 "--plot", str(tmp_path / "eval.jpg")])
    assert code == 2
    assert "ending in .png" in capsys.readouterr().err
