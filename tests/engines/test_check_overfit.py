"""The overfit gate through vLLM CPU's DFlash path: it passes on a good export and fails on a planted fault.

One sample is overfit by draftsmith's own training until its in-process tau is near the block size;
vLLM then serves the gate's export with the tiny target, and its tau on that sample must be within
10% of draftsmith's. Served with the target layer ids shifted by one (a convention off by one
between training and serving), the same weights must fail the gate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.gates.overfit import MIN_FRACTION, engine_verdict, prepare_overfit

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def gate(small_demo, tiny_target_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("overfit") / "gate"
    prepared = prepare_overfit(tiny_target_dir, work, export=small_demo.export_dir, samples=1, steps=200,
                               max_new_tokens=64)
    return small_demo, work, prepared


def _spec(export: str | Path, block_size: int) -> list[str]:
    return ["--speculative-config",
            json.dumps({"method": "dflash", "model": str(export), "num_speculative_tokens": block_size - 1})]


def test_the_overfit_gate_passes_on_vllm_and_fails_on_shifted_layer_ids(gate, tiny_target_dir, start_vllm, tmp_path,
                                                                        capsys):
    demo, work, prepared = gate
    assert prepared.in_process_tau >= MIN_FRACTION * prepared.block_size, prepared

    server = start_vllm(tiny_target_dir, "overfit-good", extra_args=_spec(prepared.export_dir, prepared.block_size))
    capsys.readouterr()  # what the fixtures and the server's start printed is not check's output
    code = main(["check", demo.export_dir, "--target", str(tiny_target_dir), "--no-parity", "--overfit",
                 "--overfit-dir", str(work), "--endpoint", server.base_url, "--json"])
    report = json.loads(capsys.readouterr().out)
    good = report["overfit"]
    server.stop()

    planted = Path(shutil.copytree(prepared.export_dir, tmp_path / "shifted"))
    config = json.loads((planted / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [i + 1 for i in config["dflash_config"]["target_layer_ids"]]
    (planted / "config.json").write_text(json.dumps(config, indent=2))
    server = start_vllm(tiny_target_dir, "overfit-shifted", extra_args=_spec(planted, prepared.block_size))
    bad = engine_verdict(prepared, server.api_url)
    server.stop()

    with capsys.disabled():
        print(f"\noverfit gate (block size {prepared.block_size}, {prepared.new_tokens} answer tokens): "
              f"in-process tau {prepared.in_process_tau:.2f} ({prepared.in_process_tau_engine_counting:.2f} counted "
              f"as vLLM does); vLLM tau {good['engine_tau']:.2f} -> {good['verdict']}; "
              f"layer ids shifted +1: vLLM tau {bad['engine_tau']:.2f} -> {bad['verdict']}")
    assert code == 0 and good["passed"] is True, good
    assert good["gap"] <= 0.10
    assert bad["passed"] is False and bad["engine_tau"] < 0.9 * prepared.in_process_tau_engine_counting, bad
    assert bad["verdict"].startswith("FAIL: engine tau")
