"""eval --endpoint's parsing of the engines' speculative counters, and the whole path against a real
HTTP server on 127.0.0.1 that replays SGLang-shaped responses (SGLang itself cannot run here).
The live vLLM path is tested in tests/engines/test_dflash_vllm.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.evaluate.endpoint import (
    evaluate_endpoint,
    parse_prometheus,
    sglang_spec_counters,
    vllm_spec_counters,
)

FIXTURES = Path(__file__).parent / "fixtures"


def test_vllm_metrics_give_tau_and_per_position_acceptance():
    text = (FIXTURES / "vllm_metrics_dflash.txt").read_text()
    counters = vllm_spec_counters(text)
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (37, 555, 30)
    assert counters.accepted_per_position == [12, 5, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert counters.tau == pytest.approx(1 + 30 / 37)
    assert counters.per_position_acceptance[0] == pytest.approx(12 / 37)
    assert vllm_spec_counters(text, model="other") .drafts == 0
    assert vllm_spec_counters("vllm:num_requests_running 0\n") is None
    assert "vllm:spec_decode_num_drafts_created" in parse_prometheus(text)  # gauges are not mixed into counts


def test_vllm_counters_are_deltas_around_the_run():
    text = (FIXTURES / "vllm_metrics_dflash.txt").read_text()
    before = vllm_spec_counters(text)
    later = text.replace('model_name="tiny"} 37.0', 'model_name="tiny"} 47.0').replace(
        'model_name="tiny"} 30.0', 'model_name="tiny"} 45.0').replace(
        'model_name="tiny",position="0"} 12.0', 'model_name="tiny",position="0"} 20.0')
    delta = vllm_spec_counters(later).minus(before)
    assert (delta.drafts, delta.accepted) == (10, 15) and delta.tau == pytest.approx(2.5)
    assert delta.accepted_per_position[:2] == [8, 0]


def _sglang_bodies():
    return json.loads((FIXTURES / "sglang_dflash_responses.json").read_text())["responses"]


def test_sglang_meta_info_fields_of_every_version():
    metas = [body["meta_info"] for body in _sglang_bodies()]
    counters = sglang_spec_counters(metas)
    # Explicit count 13 (first), histogram sum 0*2+1*2+2*2 = 6 (second), completion - verify = 4 (third).
    assert counters.drafts == 8 + 6 + 5 and counters.accepted == 13 + 6 + 4
    assert counters.draft_tokens == 120
    # Position 1 accepted in steps that accepted >= 1 draft: 6 (first) + 4 (second).
    assert counters.accepted_per_position[:3] == [6 + 4, 3 + 2, 2]
    assert counters.tau == pytest.approx(1 + 23 / 19)
    assert sglang_spec_counters([{"completion_tokens": 5}]) is None
    with pytest.raises(InputError, match="spec_accept_histogram"):
        sglang_spec_counters([{"spec_verify_ct": 2, "spec_accept_histogram": "bad"}])


class _Replay(BaseHTTPRequestHandler):
    bodies: list = []
    requests: list = []

    def log_message(self, *args):
        pass

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"data": [{"id": "tiny", "owned_by": "sglang"}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(request)
        self._send(200, type(self).bodies[(len(type(self).requests) - 1) % len(type(self).bodies)])


@pytest.fixture
def sglang_replay():
    _Replay.bodies, _Replay.requests = _sglang_bodies(), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def three_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                            for i in range(3)))
    return path


def test_endpoint_eval_reads_sglang_meta_info_over_http(sglang_replay, three_prompts):
    report = evaluate_endpoint(sglang_replay, three_prompts, baseline_endpoint=sglang_replay, max_new_tokens=32)
    assert report.source == "sglang meta_info" and report.model == "tiny"
    assert report.tau == pytest.approx(1 + 23 / 19) and report.num_drafts == 19
    assert report.total_new_tokens == 21 + 12 + 9 and report.tokens_per_s > 0
    assert report.speedup is not None and report.identical_to_baseline is True
    first = _Replay.requests[0]
    assert first["return_meta_info"] is True and first["temperature"] == 0.0 and first["max_tokens"] == 32
    assert first["messages"] == [{"role": "user", "content": "q0"}]
    assert "return_meta_info" not in _Replay.requests[3]  # the baseline is asked plainly
    assert "chat_template_kwargs" not in first and report.chat_template_kwargs is None
    assert report.thinking_mode == "enable_thinking not sent (the engine's chat template default)"
    assert report.thinking_mode in report.verdict


def test_endpoint_eval_takes_prompt_rows_in_memory(sglang_replay, three_prompts):
    # The overfit gate sends one row at a time; rows used to raise TypeError (an unknown keyword).
    rows = [json.loads(line) for line in three_prompts.read_text().splitlines()]
    report = evaluate_endpoint(sglang_replay, rows[:1], max_new_tokens=32)
    assert report.prompt_ids == ["p0"] and report.num_prompts == 1
    assert _Replay.requests[0]["messages"] == [{"role": "user", "content": "q0"}]


@pytest.mark.parametrize("thinking", [True, False])
def test_endpoint_eval_reports_the_thinking_mode_it_sent(sglang_replay, three_prompts, thinking):
    report = evaluate_endpoint(sglang_replay, three_prompts, max_new_tokens=8, enable_thinking=thinking)
    # Every measured request carried it: the mode the report names is the mode that was measured.
    assert all(r["chat_template_kwargs"] == {"enable_thinking": thinking} for r in _Replay.requests)
    assert report.chat_template_kwargs == {"enable_thinking": thinking}
    assert report.thinking_mode == f"enable_thinking={str(thinking).lower()} sent in chat_template_kwargs"
    assert report.to_dict()["thinking_mode"] == report.thinking_mode


def test_endpoint_eval_cli_json_and_errors(sglang_replay, three_prompts, tmp_path, capsys):
    assert main(["eval", "--endpoint", sglang_replay, "--prompts", str(three_prompts), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kind"] == "draftsmith.eval.endpoint" and printed["tau"] == pytest.approx(1 + 23 / 19)
    assert printed["baseline_endpoint"] is None and printed["speedup"] is None

    assert main(["eval", "--endpoint", sglang_replay, "--target", str(tmp_path), "--prompts", str(three_prompts)]) == 2
    assert "leave out --target" in capsys.readouterr().err
    assert main(["eval", "--prompts", str(three_prompts)]) == 2
    assert "give --target and --drafter" in capsys.readouterr().err


def test_an_engine_without_speculation_is_a_clear_error(sglang_replay, three_prompts):
    _Replay.bodies = [{k: v for k, v in body.items() if k != "meta_info"} for body in _sglang_bodies()]
    with pytest.raises(DraftsmithError, match="reported no speculative decoding"):
        evaluate_endpoint(sglang_replay, three_prompts)
