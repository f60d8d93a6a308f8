"""Raw HTTP against the real engines: what the generate client has to cope with.

These pin the engines' behaviour on the tiny target (field names, usage, finish reasons, token
ids), so a change in an engine release shows up here rather than as silently wrong training rows.
"""

from __future__ import annotations

import json

import httpx
import pytest

REVERSE_TIGER = [{"role": "user", "content": "Reverse the word tiger."}]
# Per engine, the message field that carries the parsed reasoning (and the one that must not).
REASONING_FIELD = {"vllm": ("reasoning", "reasoning_content"), "llama-server": ("reasoning_content", "reasoning")}

pytestmark = pytest.mark.timeout(300)


def chat(engine, messages=REVERSE_TIGER, **body) -> dict:
    payload = {"model": engine.model_name, "messages": messages, "temperature": 0.0, "max_tokens": 200,
               "chat_template_kwargs": {"enable_thinking": True}, **body}
    response = httpx.post(f"{engine.api_url}/chat/completions", json=payload, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def stream_chat(engine, **body) -> tuple[list[dict], str]:
    payload = {"model": engine.model_name, "messages": REVERSE_TIGER, "temperature": 0.0, "max_tokens": 200,
               "chat_template_kwargs": {"enable_thinking": True}, "stream": True,
               "stream_options": {"include_usage": True}, **body}
    chunks, done = [], ""
    with httpx.stream("POST", f"{engine.api_url}/chat/completions", json=payload, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                done = data
                break
            chunks.append(json.loads(data))
    return chunks, done


def test_thinking_chat_completion_splits_reasoning_from_answer(engine):
    body = chat(engine)
    choice = body["choices"][0]
    message = choice["message"]
    field, other_field = REASONING_FIELD[engine.kind]
    reasoning = message.get(field)
    assert reasoning and "The word is tiger" in reasoning, message
    assert not message.get(other_field)
    # The reasoning parser saw `<think>`/`</think>` as text and removed them from both parts.
    assert "<think>" not in reasoning and "</think>" not in reasoning
    assert "The reversed word is regit." in message["content"]
    assert "think>" not in message["content"]
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if engine.kind == "vllm":
        reasoning_tokens = usage["completion_tokens_details"]["reasoning_tokens"]
        assert 0 < reasoning_tokens < usage["completion_tokens"]


def test_enable_thinking_false_is_honoured_per_request(engine):
    body = chat(engine, chat_template_kwargs={"enable_thinking": False})
    message = body["choices"][0]["message"]
    field, _ = REASONING_FIELD[engine.kind]
    # The template pre-fills an empty think block, so the model answers straight away.
    assert not (message.get(field) or "").strip()
    # Without its reasoning the tiny target may get the word wrong (today's build answers "tiger"):
    # what is checked is that it answered at once, in the answer's form, with no think block.
    assert message["content"].startswith("The reversed word is ")
    assert "think>" not in message["content"]


def test_streaming_reports_usage_and_matches_the_blocking_answer(engine):
    blocking = chat(engine)
    chunks, done = stream_chat(engine)
    assert done == "[DONE]"
    field, _ = REASONING_FIELD[engine.kind]
    reasoning = content = ""
    finish_reasons = []
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning += delta.get(field) or ""
            content += delta.get("content") or ""
            if choice.get("finish_reason"):
                finish_reasons.append(choice["finish_reason"])
    usage_chunks = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert usage_chunks, "no usage in the stream despite stream_options.include_usage"
    assert finish_reasons == ["stop"]
    message = blocking["choices"][0]["message"]
    assert reasoning == message[field]
    assert content == message["content"]
    assert usage_chunks[-1]["completion_tokens"] == blocking["usage"]["completion_tokens"]
    assert usage_chunks[-1]["prompt_tokens"] == blocking["usage"]["prompt_tokens"]


def test_small_max_tokens_finishes_with_length(engine):
    body = chat(engine, max_tokens=5)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5
    # Cut inside the reasoning: the answer is empty, which the quality guard has to notice.
    field, _ = REASONING_FIELD[engine.kind]
    assert not (choice["message"].get("content") or "").strip() or choice["message"].get(field)


def test_vllm_return_token_ids_are_exactly_what_the_model_saw_and_produced(vllm_engine, tiny_tokenizer):
    body = chat(vllm_engine, return_token_ids=True)
    choice = body["choices"][0]
    expected_prompt = tiny_tokenizer.apply_chat_template(
        REVERSE_TIGER, add_generation_prompt=True, enable_thinking=True, tokenize=True
    )
    if isinstance(expected_prompt, dict) or hasattr(expected_prompt, "input_ids"):
        expected_prompt = expected_prompt["input_ids"]
    assert body["prompt_token_ids"] == list(expected_prompt)
    completion_ids = choice["token_ids"]
    assert len(completion_ids) == body["usage"]["completion_tokens"]
    text = tiny_tokenizer.decode(completion_ids, skip_special_tokens=False)
    message = choice["message"]
    assert text == f"<think>{message['reasoning']}</think>{message['content']}<|im_end|>"


def test_greedy_output_is_the_same_on_both_engines(vllm_engine, llama_engine):
    vllm_message = chat(vllm_engine)["choices"][0]["message"]
    llama_message = chat(llama_engine)["choices"][0]["message"]
    assert vllm_message["reasoning"].strip() == llama_message["reasoning_content"].strip()
    assert vllm_message["content"].strip() == llama_message["content"].strip()


def test_think_tokens_survive_as_text_in_llama_server_output(make_llama_server):
    # With no reasoning parser the raw completion shows whether `<think>` decoded to text
    # (added non-special tokens) or vanished (special/control tokens).
    raw = make_llama_server(reasoning_format="none").start()
    message = chat(raw)["choices"][0]["message"]
    assert message["content"].startswith("<think>\nThe word is tiger")
    assert "</think>" in message["content"]
    assert not message.get("reasoning_content")
