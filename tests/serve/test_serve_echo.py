"""The echo backend and fault injection of `draftsmith serve`, through a real server process."""

from __future__ import annotations

import json

import httpx
import pytest

from draftsmith.serve.process import ServeProcess

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse the word tiger."}]


@pytest.fixture(scope="module")
def echo_server():
    with ServeProcess(["--backend", "echo"]) as server:
        yield server


def post(server, body, **kwargs):
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30, **kwargs)


def test_health_and_models(echo_server):
    assert httpx.get(echo_server.url + "/health").status_code == 200
    models = httpx.get(echo_server.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "echo"


def test_completion_fields_and_token_ids(echo_server):
    body = post(echo_server, {"model": "echo", "messages": MESSAGES, "return_token_ids": True}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"].strip() == "The answer to Reverse the word tiger."
    assert choice["message"]["reasoning_content"].strip() == "Let me think about Reverse the word tiger."
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(body["prompt_token_ids"]) == 6
    assert usage["completion_tokens"] == len(choice["token_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # "<think>" + 8 reasoning words + "</think>"
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 10
    # Without the flag no ids are returned.
    plain = post(echo_server, {"messages": MESSAGES}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_thinking_off_and_length(echo_server):
    body = post(echo_server, {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}).json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] is None and body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    short = post(echo_server, {"messages": MESSAGES, "max_tokens": 3}).json()
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 3


def test_streaming_matches_non_streaming(echo_server):
    request = {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    with httpx.stream("POST", echo_server.url + "/v1/chat/completions", json=request, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c["choices"])
    assert content.strip() == "The answer to Reverse the word tiger."
    assert reasoning.strip() == "Let me think about Reverse the word tiger."
    assert chunks[0]["prompt_token_ids"]
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 17


def test_bad_requests_get_openai_errors(echo_server):
    response = httpx.post(echo_server.url + "/v1/chat/completions", content=b"{not json", timeout=10)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    response = post(echo_server, {"messages": []})
    assert response.status_code == 400 and "messages" in response.json()["error"]["message"]


@pytest.mark.parametrize("field", ["reasoning", "inline"])
def test_reasoning_field_styles(field):
    with ServeProcess(["--backend", "echo", "--reasoning-field", field]) as server:
        message = post(server, {"messages": MESSAGES}).json()["choices"][0]["message"]
    if field == "reasoning":  # vLLM naming
        assert message["reasoning"].strip().startswith("Let me think") and "reasoning_content" not in message
    else:  # no reasoning parser: think tags inline in content
        assert message["content"].startswith("<think>") and "</think>" in message["content"]


def test_fault_injection_fail_first_and_health():
    with ServeProcess(["--fail-first", "2", "--fail-status", "429"]) as server:
        statuses = [post(server, {"messages": MESSAGES}).status_code for _ in range(3)]
        assert statuses == [429, 429, 200]
    with ServeProcess(["--unhealthy"]) as server:
        assert httpx.get(server.url + "/health").status_code == 503


def test_fault_injection_drop_and_die():
    with ServeProcess(["--drop-rate", "1.0"]) as server:
        with pytest.raises(httpx.TransportError):
            post(server, {"messages": MESSAGES})
    with ServeProcess(["--die-after", "2"]) as server:
        assert post(server, {"messages": MESSAGES}).status_code == 200
        with pytest.raises(httpx.TransportError):
            post(server, {"messages": MESSAGES})
        server.process.wait(timeout=10)
        assert not server.running


@pytest.mark.parametrize("body, field_name", [
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": -1}, "top_p"),
    ({"seed": "abc"}, "seed"),
    ({"max_tokens": True}, "max_tokens"),
    ({"stream_options": "yes"}, "stream_options"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "text"),
])
def test_bad_field_is_a_400_naming_it_without_traceback(echo_server, body, field_name):
    response = post(echo_server, {"messages": MESSAGES, **body})
    assert response.status_code == 400 and f"'{field_name}'" in response.json()["error"]["message"], response.text
    assert post(echo_server, {"messages": MESSAGES}).status_code == 200
    assert "Traceback" not in echo_server.log_tail(100_000)
