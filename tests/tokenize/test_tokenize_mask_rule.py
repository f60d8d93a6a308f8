"""One mask rule for both ways a row is built: the same completion gives the same training row.

A generated row is built here the way `generate` builds it from an engine's answer: the engine
renders the prompt with the chat template and `chat_template_kwargs` and tokenizes it
(`prompt_token_ids`); the completion ids are the tokenization of the text the model wrote, with
the end-of-turn id when it stopped (vLLM's `return_token_ids`); the message comes from the
engine's response body (reasoning parser or inline tags) through the client's own parser. Then
tokenize builds the row once from those engine ids and once through the chat template, and the two
must agree token for token, mask included.

The last test does the same with a real server (`draftsmith serve` on the tiny target) whose ids
are the model's own greedy generation.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from draftsmith.client.chat import parse_chat_response
from draftsmith.data.reasoning import THINK_CLOSE, THINK_OPEN
from draftsmith.data.sources import Record
from draftsmith.tokenize.masking import ChatMasker, MaskerConfig, RowDropped
from draftsmith.tokenize.pipeline import masker_row

USER = {"role": "user", "content": "Reverse the word tiger."}
EARLIER = [
    {"role": "user", "content": "Write harbor in capital letters."},
    {"role": "assistant", "content": "HARBOR.", "reasoning_content": "The word is harbor."},
]
REASONING = "The word is tiger. Its letters are t i g e r. Read backwards they are r e g i t."
ANSWER = "The reversed word is regit."
EOT = "<|im_end|>"


def engine_body(tokenizer, prompt_text, completion_text, finish_reason, style):
    """An OpenAI response as an engine returns it for `completion_text` (the model's raw output)."""
    message = {"role": "assistant"}
    closed = THINK_CLOSE in completion_text
    if style == "parser" and (closed or completion_text.startswith(THINK_OPEN)):
        # The qwen3 reasoning parsers: the inside of the block, whitespace untouched.
        inside, _, content = completion_text.partition(THINK_CLOSE)
        message["reasoning_content"] = inside.removeprefix(THINK_OPEN)
        message["content"] = content or None
    else:
        message["content"] = completion_text
    completion_ids = tokenizer(completion_text, add_special_tokens=False)["input_ids"]
    if finish_reason == "stop":
        completion_ids.append(tokenizer.convert_tokens_to_ids(EOT))
    return {
        "model": "tiny",
        "prompt_token_ids": tokenizer(prompt_text, add_special_tokens=False)["input_ids"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "token_ids": completion_ids}],
    }


def generated_row(prompt_messages, body):
    """The row `generate` writes for an answer (see generate.pipeline's `_complete`)."""
    result = parse_chat_response(body, latency_s=0.0)
    return {
        "id": "r1",
        "messages": [
            *prompt_messages,
            {"role": "assistant", "content": result.content, "reasoning_content": result.reasoning},
        ],
        "finish_reason": result.finish_reason,
        "prompt_token_ids": result.prompt_token_ids,
        "completion_token_ids": result.completion_token_ids,
    }


def both_ways(tokenizer, tiny_target_dir, row, template_kwargs):
    config = dict(length_policy="keep", chat_template_kwargs=tuple(sorted(template_kwargs.items())))
    normalized = masker_row(Record("generated.jsonl:1", row=row))
    by_ids = ChatMasker(tokenizer, MaskerConfig(**config), tiny_target_dir).build(normalized)
    template_config = MaskerConfig(use_engine_token_ids=False, **config)
    by_template = ChatMasker(tokenizer, template_config, tiny_target_dir).build(normalized)
    assert by_ids.method == "engine_token_ids" and by_template.method == "template_prefix"
    assert by_template.verified
    return by_ids, by_template


def trained(tokenizer, built) -> str:
    return tokenizer.decode(built.input_ids[built.loss_mask == 1].tolist(), skip_special_tokens=False)


CASES = {
    "think-block": ([USER], f"<think>\n{REASONING}\n</think>\n\n{ANSWER}", "stop", {}),
    "empty-think-block-the-model-wrote": ([USER], f"<think>\n\n</think>\n\n{ANSWER}", "stop", {}),
    "unclosed-think-cut-by-max-tokens": ([USER], "<think>\nThe word is tiger. Its letters", "length", {}),
    "cut-inside-the-answer": ([USER], f"<think>\n{REASONING}\n</think>\n\nThe reversed", "length", {}),
    "multi-turn": ([*EARLIER, USER], f"<think>\n{REASONING}\n</think>\n\n{ANSWER}", "stop", {}),
    "multi-turn-empty-think-block": ([*EARLIER, USER], f"<think>\n\n</think>\n\n{ANSWER}", "stop", {}),
    # Thinking off: the template put the empty block in the prompt; the model wrote the answer only.
    "thinking-off": ([USER], ANSWER, "stop", {"enable_thinking": False}),
    # Literal tags the model wrote in its answer stay verbatim: text, not a second think block.
    "literal-think-tags-in-the-answer": (
        [USER], f"<think>\n{REASONING}\n</think>\n\nKeep this: <think> and </think> then the answer.", "stop", {}
    ),
}


@pytest.mark.parametrize("style", ["parser", "inline"])
@pytest.mark.parametrize("case", list(CASES))
def test_engine_ids_and_template_give_the_same_row(tiny_tokenizer, tiny_target_dir, case, style):
    prompt_messages, completion, finish_reason, kwargs = CASES[case]
    prompt_text = tiny_tokenizer.apply_chat_template(
        prompt_messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    row = generated_row(prompt_messages, engine_body(tiny_tokenizer, prompt_text, completion, finish_reason, style))
    by_ids, by_template = both_ways(tiny_tokenizer, tiny_target_dir, row, kwargs)
    assert by_template.input_ids.tolist() == by_ids.input_ids.tolist()
    assert by_template.loss_mask.tolist() == by_ids.loss_mask.tolist()
    # And what both train is exactly what the model wrote (with its end-of-turn when it stopped).
    assert trained(tiny_tokenizer, by_template) == completion + (EOT if finish_reason == "stop" else "")
    first = int(np.flatnonzero(by_ids.loss_mask)[0])
    assert tiny_tokenizer.decode(by_ids.input_ids[:first].tolist(), skip_special_tokens=False) == prompt_text


@pytest.mark.parametrize("completion", ["<think>\n\n</think>\n\n", ""])
def test_an_empty_answer_is_dropped_on_both_paths(tiny_tokenizer, tiny_target_dir, completion):
    prompt_text = tiny_tokenizer.apply_chat_template([USER], tokenize=False, add_generation_prompt=True)
    row = generated_row([USER], engine_body(tiny_tokenizer, prompt_text, completion, "stop", "parser"))
    normalized = masker_row(Record("generated.jsonl:1", row=row))
    for use_ids in (True, False):
        with pytest.raises(RowDropped) as caught:
            ChatMasker(tiny_tokenizer, MaskerConfig(use_engine_token_ids=use_ids), tiny_target_dir).build(normalized)
        assert caught.value.reason == "empty_assistant"


def test_template_inserted_block_is_not_trained_on_either_path(tiny_tokenizer, tiny_target_dir):
    # A conversation row with no reasoning at all: the template renders an empty block for the
    # final turn that nobody wrote. Its engine-id equivalent is a thinking-off generation.
    messages = [USER, {"role": "assistant", "content": ANSWER}]
    masker = ChatMasker(tiny_tokenizer, MaskerConfig(), tiny_target_dir)
    built = masker.build(masker_row(Record("data.jsonl:1", row={"id": "r1", "messages": messages})))
    assert trained(tiny_tokenizer, built) == ANSWER + EOT
    prompt_text = tiny_tokenizer.apply_chat_template(
        [USER], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    row = generated_row([USER], engine_body(tiny_tokenizer, prompt_text, ANSWER, "stop", "parser"))
    by_ids, _ = both_ways(tiny_tokenizer, tiny_target_dir, row, {"enable_thinking": False})
    assert by_ids.input_ids.tolist() == built.input_ids.tolist()
    assert by_ids.loss_mask.tolist() == built.loss_mask.tolist()


@pytest.fixture(scope="module")
def tiny_server(tiny_target_dir):
    from draftsmith.serve.process import ServeProcess

    with ServeProcess(["--model", str(tiny_target_dir), "--served-model-name", "tiny"]) as server:
        yield server


@pytest.mark.parametrize(
    "max_tokens, kwargs",
    [(256, {}), (12, {}), (256, {"enable_thinking": False})],
    ids=["stopped", "cut-by-max-tokens", "thinking-off"],
)
def test_a_real_engine_generation_gives_the_same_row_both_ways(
    tiny_server, tiny_tokenizer, tiny_target_dir, max_tokens, kwargs
):
    from draftsmith.tiny import synthetic_prompts

    prompt_messages = next(synthetic_prompts(1, seed=3))["messages"]
    response = httpx.post(
        tiny_server.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": prompt_messages, "temperature": 0, "max_tokens": max_tokens,
              "return_token_ids": True, "chat_template_kwargs": kwargs},
        timeout=120,
    )
    body = response.json()
    row = generated_row(prompt_messages, body)
    assert row["finish_reason"] == ("length" if max_tokens == 12 else "stop")
    by_ids, by_template = both_ways(tiny_tokenizer, tiny_target_dir, row, kwargs)
    assert by_template.input_ids.tolist() == by_ids.input_ids.tolist()
    assert by_template.loss_mask.tolist() == by_ids.loss_mask.tolist()
    assert int(np.flatnonzero(by_ids.loss_mask)[0]) == len(body["prompt_token_ids"])


@pytest.mark.parametrize("finish_reason", ["stop", "length"])
def test_a_think_block_the_model_never_closed_is_not_closed_on_the_template_path(
    tiny_tokenizer, tiny_target_dir, finish_reason
):
    # A raw (inline) row: the model stopped, or was cut, inside its think block. The template
    # would close the block (`\n</think>\n\n`); the engine's ids never had those tokens.
    completion = "<think>\nThe word is tiger. Its letters are t i g e r."
    prompt_text = tiny_tokenizer.apply_chat_template([USER], tokenize=False, add_generation_prompt=True)
    completion_ids = tiny_tokenizer(completion, add_special_tokens=False)["input_ids"]
    if finish_reason == "stop":
        completion_ids.append(tiny_tokenizer.convert_tokens_to_ids(EOT))
    row = {
        "id": "r1", "messages": [USER, {"role": "assistant", "content": completion}], "finish_reason": finish_reason,
        "prompt_token_ids": tiny_tokenizer(prompt_text, add_special_tokens=False)["input_ids"],
        "completion_token_ids": completion_ids,
    }
    by_ids, by_template = both_ways(tiny_tokenizer, tiny_target_dir, row, {})
    assert trained(tiny_tokenizer, by_template) == completion + (EOT if finish_reason == "stop" else "")
    assert by_template.input_ids.tolist() == by_ids.input_ids.tolist()
    assert by_template.loss_mask.tolist() == by_ids.loss_mask.tolist()
