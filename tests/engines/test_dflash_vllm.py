"""The exported drafter where it will run: vLLM CPU's own DFlash speculative decoding.

The small demo's export is served with the tiny target through `--speculative-config
'{"method": "dflash", ...}'` at num_speculative_tokens = block_size - 1 and at a smaller value.
Greedy outputs must be token-identical to the plain vLLM server, and the acceptance length vLLM
counts (its /metrics spec-decode counters, read by `draftsmith eval --endpoint`) must match
draftsmith's in-process speculative decoding on the same prompts within 5%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.evaluate import evaluate_drafter, evaluate_endpoint

pytestmark = pytest.mark.timeout(900)

MAX_NEW_TOKENS = 96
SMALLER_K = 4


@pytest.fixture(scope="module")
def demo_export(small_demo):
    config = json.loads((Path(small_demo.export_dir) / "config.json").read_text())
    return small_demo, int(config["block_size"])


@pytest.fixture(scope="module", params=["block_size-1", SMALLER_K])
def spec_engine(request, demo_export, tiny_target_dir, start_vllm):
    demo, block_size = demo_export
    k = block_size - 1 if request.param == "block_size-1" else request.param
    spec = json.dumps({"method": "dflash", "model": demo.export_dir, "num_speculative_tokens": k})
    server = start_vllm(tiny_target_dir, f"dflash-k{k}", extra_args=["--speculative-config", spec])
    yield server, k
    server.stop()  # one speculative server at a time beside the plain one: each holds ~3.4 GB


def test_vllm_serves_the_export_losslessly_with_our_acceptance_length(spec_engine, vllm_engine, demo_export,
                                                                      tiny_target_dir, tmp_path, capsys):
    server, k = spec_engine
    demo, _ = demo_export
    prompts = Path(demo.export_dir).parent / "eval_prompts.jsonl"

    engine = evaluate_endpoint(server.api_url, prompts, baseline_endpoint=vllm_engine.api_url,
                               max_new_tokens=MAX_NEW_TOKENS)
    ours = evaluate_drafter(tiny_target_dir, demo.export_dir, prompts, max_new_tokens=MAX_NEW_TOKENS, block_size=k + 1)
    with capsys.disabled():
        print(f"\nvLLM DFlash k={k}: engine tau {engine.tau:.3f} over {engine.num_drafts} steps; "
              f"draftsmith eval tau {ours.tau:.3f} ({ours.tau_engine_counting:.3f} counting drafts past EOS "
              f"as vLLM does) over {ours.total_cycles} cycles; "
              f"per position vLLM {[round(x, 2) for x in engine.per_position_acceptance[:6]]} "
              f"ours {[round(x, 2) for x in ours.per_position_acceptance_engine_counting[:6]]}")

    assert engine.source == "vllm /metrics" and engine.num_prompts == 6
    assert engine.identical_to_baseline, f"speculative output differs from plain vLLM for {engine.mismatched_prompts}"
    assert len(engine.per_position_acceptance) == k
    assert ours.lossless
    assert engine.tau > 1.15  # the trained drafter is really accepted by the engine (untrained: about 1.0)
    assert abs(engine.tau - ours.tau) <= 0.05 * ours.tau, (engine.tau, ours.tau)
    # Counted the same way, the two cycle-by-cycle processes agree closer still.
    assert abs(engine.tau - ours.tau_engine_counting) <= 0.02 * ours.tau_engine_counting
    for theirs, mine in zip(engine.per_position_acceptance, ours.per_position_acceptance_engine_counting, strict=True):
        assert abs(theirs - mine) <= 0.05

    if k == SMALLER_K:
        # The same measurement through the command line, as a user runs it.
        out = tmp_path / "endpoint.json"
        code = main(["eval", "--endpoint", server.base_url, "--baseline-endpoint", vllm_engine.base_url,
                     "--prompts", str(prompts), "--max-new-tokens", str(MAX_NEW_TOKENS), "--json", "--out", str(out)])
        assert code == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed == json.loads(out.read_text())
        assert printed["kind"] == "draftsmith.eval.endpoint" and printed["identical_to_baseline"] is True
        assert printed["num_drafts"] > 0 and abs(printed["tau"] - engine.tau) < 1e-9
