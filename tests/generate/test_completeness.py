"""The one row-completeness rule (`data.generated.incomplete_answer`) generate and tokenize share."""

from __future__ import annotations

import numpy as np
import pytest

from draftsmith.data.generated import incomplete_answer

PROMPT = [{"role": "user", "content": "q"}]
CALL = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


def row(answer, **fields):
    return {"id": "a", "messages": [*PROMPT, {"role": "assistant", **answer}], **fields}


@pytest.mark.parametrize("value", [
    row({"content": "ok"}, finish_reason="stop"),
    row({"content": "cut at max tokens"}, finish_reason="length"),
    row({"content": None, "tool_calls": CALL}, finish_reason="tool_calls"),
    row({"content": ""}, finish_reason="stop"),
    row({"content": None, "reasoning_content": "thinking, cut off"}, finish_reason="length"),  # empty is an answer (the audit judges it), not a cut-off
    row({"content": [{"type": "text", "text": "parts"}]}, finish_reason="stop"),
    row({"content": "a dataset row without engine fields"}),
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
    {"messages": PROMPT},  # no answer: for the row parser to report
    "not a row",
    {"messages": np.array([PROMPT[0], {"role": "assistant", "content": "columnar", "tool_calls": None}]),
     "finish_reason": "stop"},
])
def test_complete_answers(value):
    assert incomplete_answer(value) is None


@pytest.mark.parametrize("value, problem", [
    (row({"content": "streamed, then the connection dropped"}, finish_reason=None), "finish_reason is null"),
    (row({"content": "x"}, finish_reason="abort"), "gave up"),
    (row({"content": "x"}, finish_reason=3), "not an engine's finish reason"),
    (row({"content": "x"}, finish_reason=""), "not an engine's finish reason"),
    (row({"content": None}, finish_reason="stop"), "content is null"),
    (row({"content": None, "tool_calls": []}, finish_reason="stop"), "content is null"),
    (row({"content": None, "reasoning_content": " "}, finish_reason="stop"), "content is null"),
    (row({"content": 42}, finish_reason="stop"), "content is a int"),
    (row({"content": {"text": "x"}}), "content is a dict"),
    (row({"content": [{"type": "image_url"}]}, finish_reason="stop"), "content is a list"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": None}]}, "content is null"),
])
def test_incomplete_answers(value, problem):
    assert problem in incomplete_answer(value)
