"""Property-based fuzzing of the chat-completion parser (streamed and not): whatever an engine
sends, the answer is a ChatResult that is a complete answer, or a clean ClientError; never a
traceback from inside the parser."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftsmith.client.chat import ChatResult, ClientError, StreamParser, parse_chat_body, parse_chat_response
from draftsmith.data.generated import generated_row, incomplete_answer

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)
# Bodies shaped like chat completions, with any field swapped for anything.
maybe = lambda strategy: st.one_of(strategy, json_values)  # noqa: E731
messages = st.fixed_dictionaries({}, optional={
    "role": maybe(st.just("assistant")), "content": maybe(st.text(max_size=30)),
    "reasoning_content": maybe(st.text(max_size=30)), "reasoning": maybe(st.text(max_size=30)),
    "tool_calls": maybe(st.lists(st.fixed_dictionaries({"id": maybe(st.text()), "function": maybe(
        st.fixed_dictionaries({"name": maybe(st.text()), "arguments": maybe(st.text())}))}), max_size=2)),
})
choices = st.fixed_dictionaries({}, optional={
    "message": maybe(messages), "delta": maybe(messages), "finish_reason": maybe(st.sampled_from(["stop", "length"])),
    "token_ids": maybe(st.lists(st.integers(0, 100), max_size=4)), "index": maybe(st.integers(0, 2)),
})
bodies = st.fixed_dictionaries({}, optional={
    "choices": maybe(st.lists(choices, max_size=2)), "model": maybe(st.text(max_size=10)),
    "usage": maybe(st.fixed_dictionaries({}, optional={"prompt_tokens": maybe(st.integers()),
                                                       "completion_tokens_details": json_values})),
    "prompt_token_ids": maybe(st.lists(st.integers(0, 100), max_size=4)), "error": json_values,
})


def check(result: ChatResult) -> None:
    assert isinstance(result.content, str) and isinstance(result.reasoning, str)
    assert isinstance(result.finish_reason, str) and result.finish_reason
    for ids in (result.prompt_token_ids, result.completion_token_ids):
        assert ids is None or all(type(item) is int for item in ids)
    row = generated_row("x", [{"role": "user", "content": "q"}], result.content, result.reasoning,
                        tool_calls=result.tool_calls, finish_reason=result.finish_reason)
    assert incomplete_answer(row) is None  # what the parser accepts is a complete answer by the one rule
    json.dumps(row, allow_nan=False)


@FUZZ
@given(st.one_of(bodies, json_values))
def test_any_non_streamed_body_parses_or_fails_cleanly(body):
    try:
        check(parse_chat_response(body, 0.0))
    except ClientError:
        pass


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_as_a_body_fail_cleanly(raw):
    try:
        check(parse_chat_body(raw, 0.0))
    except ClientError:
        pass


def _sse(chunk) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    return b"data: " + json.dumps(chunk).encode()


@FUZZ
@given(st.lists(st.one_of(bodies, json_values, st.binary(max_size=40), st.just(b"data: [DONE]")), max_size=6))
def test_any_stream_parses_or_fails_cleanly(chunks):
    parser = StreamParser()
    try:
        for chunk in chunks:
            if parser.feed(_sse(chunk)):
                break
        check(parser.result())
    except ClientError:
        pass


@FUZZ
@given(st.lists(st.text(max_size=8), min_size=1, max_size=5), st.integers(0, 5))
def test_a_stream_is_an_answer_only_with_its_finish_reason_and_done(pieces, cut):
    lines = [_sse({"choices": [{"delta": {"content": piece}}]}) for piece in pieces]
    lines += [_sse({"choices": [{"delta": {}, "finish_reason": "stop"}]}), b"data: [DONE]"]
    parser = StreamParser()
    kept = lines[: max(0, len(lines) - cut)]
    for line in kept:
        parser.feed(line)
    if cut:
        try:
            parser.result()
        except ClientError as error:
            assert error.retryable and "the stream ended without" in str(error)
        else:
            raise AssertionError("a cut stream was taken as an answer")
    else:
        assert parser.result().content == "".join(pieces).strip()
