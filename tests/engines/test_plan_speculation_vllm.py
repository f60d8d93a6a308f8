"""`plan speculation` checked against vLLM CPU here (the CI-sized run of benchmarks/bench_speculation.py):
the tiny target served plainly, with the small demo's DFlash drafter at one K and with n-gram; `bench`
stores vLLM's own per-position acceptance, `plan speculation --acceptance-from bench.json` reads it,
and the prediction from this machine's measured device (the engine's overhead, fixed and per request,
calibrated on plain decode at concurrency 1 and 4, a speculative step's extra on K at concurrency 1 and 4)
is within 2x of the measured tok/s at every other point (n-gram at both)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.cli import main

pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parents[2]
K = 3


def test_predicted_against_measured_through_vllm(small_demo, tiny_target_dir, tmp_path, capsys):
    from draftsmith.engines import EngineNotInstalled, vllm_python

    from tests.engines.conftest import engine_unavailable

    try:
        vllm_python()
    except EngineNotInstalled as error:
        engine_unavailable(str(error))
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    argv = [sys.executable, str(ROOT / "benchmarks" / "bench_speculation.py"), "--ks", str(K), "--concurrency", "1,4",
            "--requests", "8", "--max-tokens", "48", "--prompts", "16", "--export", small_demo.export_dir,
            "--workdir", str(tmp_path / "work"), "--json", str(out)]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1700)
    assert result.returncode == 0, result.stderr[-3000:]
    with capsys.disabled():
        print("\n" + result.stdout)
    data = json.loads(out.read_text())

    # bench stored vLLM's per-position acceptance: K positions, never rising, the trained drafter accepted.
    profile = data["acceptance"]
    assert len(profile) == K and all(a >= b for a, b in zip(profile, profile[1:])) and profile[0] > 0.1
    bench = json.loads((tmp_path / "work" / f"bench-dflash-k{K}.json").read_text())
    level = bench["results"][0]["engine_metrics"]
    assert len(level["spec_acceptance_per_position"]) == K and level["spec_drafts"] > 0
    assert level["spec_acceptance"] == pytest.approx(1 + sum(level["spec_accepted_per_position"]) / level["spec_drafts"],
                                                     abs=1e-3)

    # The device is measured with the threads vLLM CPU computes on: every CPU but the one it reserves.
    assert data["engine_threads"] == max(1, (os.cpu_count() or 1) - 1) and data["device"]["title"].endswith(
        f"{data['engine_threads']} threads (measured)"), data["device"]

    rows = {(row["method"], row["k"], row["concurrency"]): row for row in data["rows"]}
    assert set(rows) == {(method, k, c) for method, k in (("none", 0), ("dflash", K), ("ngram", K)) for c in (1, 4)}
    calibration = {("none", 0, 1), ("none", 0, 4), ("dflash", K, 1), ("dflash", K, 4)}  # the overheads are fitted on these
    for key, row in rows.items():
        assert row["measured_tokens_per_s"] > 0
        if key not in calibration:
            assert 0.5 <= row["ratio"] <= 2.0, (key, row)
    # Speculation's tau as vLLM counted it is the tau the plan used (the same counters).
    assert rows[("dflash", K, 1)]["predicted_tau"] == pytest.approx(1 + sum(profile))

    # The same bench file through the command line, as a user runs it.
    code = main(["plan", "speculation", "--model-config", str(tiny_target_dir), "--drafter", small_demo.export_dir,
                 "--gpu", str(tmp_path / "work" / "device.json"), "--weights", "fp32", "--engine", "vllm",
                 "--acceptance-from", str(tmp_path / "work" / f"bench-dflash-k{K}.json"), "--output-mean", "40",
                 "--concurrency", "1,4", "--json"])
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["acceptance"]["per_position"] == pytest.approx(profile)
    assert [entry["best_k"] for entry in plan["plans"]] and plan["step_overhead_s"] == pytest.approx(data["step_overhead_s"])
