"""The Hugging Face backend of `draftsmith serve` on the tiny target, through a real server process."""

from __future__ import annotations

import asyncio
import functools
import json

import httpx
import pytest
import torch

from draftsmith.serve.process import ServeProcess
from draftsmith.tiny import synthetic_prompts

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def model_server(tiny_target_dir):
    with ServeProcess(["--model", str(tiny_target_dir), "--served-model-name", "tiny", "--max-batch-size", "8",
                       "--batch-wait-ms", "50"]) as server:
        yield server


@functools.lru_cache(maxsize=1)
def load_reference(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def reference_greedy(model_dir, tokenizer, messages, max_tokens, **template_kwargs):
    model = load_reference(str(model_dir))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return prompt, out[0, len(prompt):].tolist()


def test_concurrent_batched_greedy_matches_transformers(model_server, tiny_target_dir, tiny_tokenizer):
    prompts = [row["messages"] for row in synthetic_prompts(3, seed=5)]

    async def ask_all():
        async with httpx.AsyncClient(timeout=120) as client:
            requests = [
                client.post(model_server.url + "/v1/chat/completions", json={
                    "model": "tiny", "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS,
                    "return_token_ids": True})
                for messages in prompts
            ]
            return [r.json() for r in await asyncio.gather(*requests)]

    answers = asyncio.run(ask_all())
    for messages, body in zip(prompts, answers):
        prompt, expected = reference_greedy(tiny_target_dir, tiny_tokenizer, messages, MAX_TOKENS)
        choice = body["choices"][0]
        assert body["prompt_token_ids"] == prompt
        assert choice["token_ids"] == expected
        stopped = expected[-1] == tiny_tokenizer.eos_token_id
        assert choice["finish_reason"] == ("stop" if stopped else "length")
        usage = body["usage"]
        assert usage["prompt_tokens"] == len(prompt) and usage["completion_tokens"] == len(expected)
        text = tiny_tokenizer.decode(expected, skip_special_tokens=True)
        assert text.startswith("<think>")
        if "</think>" in text:
            reasoning, content = text.split("</think>", 1)
            assert choice["message"]["reasoning_content"] == reasoning[len("<think>"):]
            assert choice["message"]["content"] == content
            think_end = tiny_tokenizer.convert_tokens_to_ids("</think>")
            assert usage["completion_tokens_details"]["reasoning_tokens"] == expected.index(think_end) + 1


def test_thinking_disabled_prefills_empty_think(model_server, tiny_target_dir, tiny_tokenizer):
    messages = [{"role": "user", "content": "Reverse the word tiger."}]
    body = httpx.post(model_server.url + "/v1/chat/completions", timeout=120, json={
        "messages": messages, "temperature": 0, "max_tokens": 24, "return_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False}}).json()
    prompt, _ = reference_greedy(tiny_target_dir, tiny_tokenizer, messages, 1, enable_thinking=False)
    assert body["prompt_token_ids"] == prompt
    assert tiny_tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")
    assert not body["choices"][0]["message"]["reasoning_content"]
    assert body["choices"][0]["message"]["content"].strip()


def test_streaming_equals_non_streaming(model_server):
    messages = [{"role": "user", "content": "Spell tiger letter by letter."}]
    request = {"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS, "return_token_ids": True}
    whole = httpx.post(model_server.url + "/v1/chat/completions", json=request, timeout=120).json()
    streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", model_server.url + "/v1/chat/completions", json=streamed, timeout=120) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    reasoning = "".join(d["delta"].get("reasoning_content") or "" for d in deltas)
    ids = [i for d in deltas for i in d.get("token_ids") or []]
    choice = whole["choices"][0]
    assert ids == choice["token_ids"]
    assert content == choice["message"]["content"]
    assert reasoning == (choice["message"]["reasoning_content"] or "")
    assert chunks[-1]["usage"] == whole["usage"]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]


BAD_SAMPLING_FIELDS = [
    ("seed", '"abc"'),
    ("seed", str(2**80)),
    ("temperature", "NaN"),
    ("top_p", "-1"),
    ("temperature", '"hot"'),
]


def test_bad_sampling_field_is_its_own_400_and_the_batch_is_answered(model_server):
    """Each bad field is refused alone (400 naming it); good requests in the same batch are answered;
    the server log carries no traceback."""
    messages = json.dumps([{"role": "user", "content": "Reverse the word tiger."}])

    def raw(field_name, value):  # raw JSON: NaN and 2**80 are valid JSON for Python, not for httpx's encoder
        return f'{{"messages": {messages}, "max_tokens": 8, "{field_name}": {value}}}'.encode()

    good = f'{{"messages": {messages}, "max_tokens": 8, "temperature": 0.7, "seed": 3}}'.encode()
    bodies = [raw(name, value) for name, value in BAD_SAMPLING_FIELDS] + [good, good]

    async def ask_all():
        async with httpx.AsyncClient(timeout=120) as client:
            requests = [client.post(model_server.url + "/v1/chat/completions", content=body,
                                    headers={"content-type": "application/json"}) for body in bodies]
            return await asyncio.gather(*requests)

    responses = asyncio.run(ask_all())
    for (name, value), response in zip(BAD_SAMPLING_FIELDS, responses):
        assert response.status_code == 400, (name, value, response.status_code, response.text)
        assert f"'{name}'" in response.json()["error"]["message"], (name, value, response.text)
    for response in responses[len(BAD_SAMPLING_FIELDS):]:
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] > 0
    assert "Traceback" not in model_server.log_tail(100_000)
