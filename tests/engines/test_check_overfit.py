"""The overfit gate through vLLM CPU's DFlash path: PASS on a good export, FAIL on each planted fault.

The gate judges the small demo's drafter (trained on 160 varied prompts, so it must read the
target's features to draft unseen prompts; `--no-overfit-train`, since training its own costs CI a
minute more and tests/check covers that path). Held-out prompts are decoded in process and by vLLM
serving the export; per prompt and draft position the accepted counts must agree within the
tolerance (5% of accepted draft tokens). Each planted fault (layer ids shifted by one, mask token
off by one, RoPE theta x100) is then served by vLLM in a copy of the export and must fail the gate
with its disagreement at least `MIN_MARGIN` (3) times the tolerance. The printed margin is that
fault gap / limit. The old gate (one memorised sample, tau within 10%) could not see shifted layer
ids on some CPUs: the memorised answer needs no features.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.gates.overfit import FAULTS, MIN_MARGIN, TOLERANCE, engine_verdict, prepare_overfit

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def gate(small_demo, tiny_target_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("overfit") / "gate"
    return small_demo, work, prepare_overfit(tiny_target_dir, work, export=small_demo.export_dir, train=False)


def _spec(export: str | Path, block_size: int) -> list[str]:
    return ["--speculative-config",
            json.dumps({"method": "dflash", "model": str(export), "num_speculative_tokens": block_size - 1})]


def _judge_through_check(demo, work: Path, tiny_target_dir, endpoint: str, capsys) -> tuple[int, dict]:
    capsys.readouterr()  # what the fixtures and the server's start printed is not check's output
    code = main(["check", demo.export_dir, "--target", str(tiny_target_dir), "--no-parity", "--overfit",
                 "--no-overfit-train", "--overfit-dir", str(work), "--endpoint", endpoint, "--json"])
    return code, json.loads(capsys.readouterr().out)["overfit"]


def test_the_gate_passes_the_served_export_and_fails_each_planted_fault_by_a_wide_margin(
        gate, tiny_target_dir, start_vllm, capsys):
    demo, work, prepared = gate
    assert prepared.sensitive, prepared.planted_faults  # the gate's drafter can show every fault at all
    verdicts, seconds = {}, {}
    for case in ("clean", *FAULTS):
        began = time.monotonic()
        served = prepared.export_dir if case == "clean" else prepared.planted_faults[case]["dir"]
        server = start_vllm(tiny_target_dir, f"gate-{case.replace(' ', '-')}",
                            extra_args=_spec(served, prepared.block_size))
        if case == "clean":
            code, verdicts[case] = _judge_through_check(demo, work, tiny_target_dir, server.base_url, capsys)
            assert code == 0, verdicts[case]
        else:
            verdicts[case] = engine_verdict(prepared, server.api_url)
        server.stop()
        seconds[case] = time.monotonic() - began

    with capsys.disabled():
        print(f"\noverfit gate on {len(prepared.acceptance)} held-out prompts (block size {prepared.block_size}, "
              f"limit {TOLERANCE:.0%} of accepted draft tokens); in-process tau {prepared.in_process_tau:.2f} "
              f"({prepared.in_process_tau_engine_counting:.2f} counted as vLLM does)")
        for case, verdict in verdicts.items():
            predicted = prepared.planted_faults.get(case, {}).get("disagreement", 0.0)
            print(f"  {case:22s} vLLM tau {verdict['engine_tau']:.2f}, disagreement {verdict['disagreement']:6.1%} "
                  f"(in process {predicted:5.1%}), margin {verdict['disagreement'] / TOLERANCE:5.1f}x the limit, "
                  f"{verdict['prompts_identical']}/{verdict['prompts']} prompts identical, "
                  f"{'PASS' if verdict['passed'] else 'FAIL'} ({seconds[case]:.0f} s with the server's start)")

    clean = verdicts["clean"]
    assert clean["passed"] is True and clean["verdict"].startswith("PASS"), clean
    assert clean["disagreement"] <= TOLERANCE
    for fault in FAULTS:
        bad = verdicts[fault]
        assert bad["passed"] is False and bad["verdict"].startswith("FAIL: engine and in-process disagree"), bad
        assert bad["disagreement"] >= MIN_MARGIN * TOLERANCE, (fault, bad["disagreement"])
        # vLLM with the fault planted does what draftsmith predicts of it in process.
        assert abs(bad["disagreement"] - prepared.planted_faults[fault]["disagreement"]) <= TOLERANCE, fault
