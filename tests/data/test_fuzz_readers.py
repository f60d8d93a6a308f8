"""Property-based fuzzing of the row readers: whatever the bytes or the decoded row, a reader
gives rows or a one-line `InputError` naming where, never another exception (a traceback)."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from draftsmith.core.errors import InputError
from draftsmith.data.conversation import conversation_from_row
from draftsmith.data.prompts import prompt_from_row
from draftsmith.data.sources import count_records, iter_records, resolve

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = ["id", "messages", "conversations", "tools", "role", "content", "from", "value", "reasoning_content",
        "reasoning", "tool_calls", "name", "arguments", "function", "type", "text", "finish_reason"]
SPEAKERS = ["user", "assistant", "human", "gpt", "function_call", "observation", "tool", "system", "GPT", "alien"]
texts = st.one_of(st.text(max_size=20), st.sampled_from(["<think>", "</think>", "<think>x</think>y", "\ud800", "[", "{"]),
                  st.sampled_from(SPEAKERS))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), texts)
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), children, max_size=5)),
    max_leaves=25,
)
turns = st.fixed_dictionaries(
    {}, optional={"role": st.sampled_from(SPEAKERS) | values, "from": st.sampled_from(SPEAKERS) | values,
                  "content": values, "value": values, "reasoning_content": values, "reasoning": values,
                  "tool_calls": values, "name": values},
)
rows = st.one_of(
    values,
    st.fixed_dictionaries({}, optional={"id": values, "messages": st.lists(turns, max_size=4) | values,
                                        "conversations": st.lists(turns, max_size=4) | values, "tools": values,
                                        "finish_reason": values}),
)


def _only_one_line_errors(call, where):
    try:
        call()
    except InputError as error:
        message = str(error)
        assert "\n" not in message and message.startswith(where), message


@FUZZ
@given(row=rows)
@example(row={"messages": [{"role": "user", "content": "\ud800"}]})  # a lone surrogate, no id: hashed
@example(row={"tools": "[{", "messages": [{"role": "user", "content": "q"}]})
@example(row={"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "[1]"}]})
def test_any_decoded_row_is_a_conversation_or_a_one_line_error(row):
    _only_one_line_errors(lambda: conversation_from_row(row, "f.jsonl:7"), "f.jsonl:7")
    _only_one_line_errors(lambda: prompt_from_row(row, "f.jsonl:7"), "f.jsonl:7")


@FUZZ
@given(row=rows)
def test_any_json_line_is_a_row_or_a_one_line_error(row):
    line = json.dumps(row, ensure_ascii=True, allow_nan=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        path.write_text(line + "\n", encoding="utf-8")
        _only_one_line_errors(lambda: [conversation_from_row(r.parse(), r.where) for r in iter_records([path])], str(path))


@FUZZ
@given(data=st.binary(max_size=200) | st.sampled_from([b'[{"id": 1}', b"[\xff]", b'{"messages": "\\ud800"}\n', b"\x1f\x8b\x08",
                                                      b'[{"messages": [{"role": "user", "content": "\\udfff"}]}]']),
       suffix=st.sampled_from([".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet", ".arrow"]),
       gzipped=st.booleans())
def test_any_file_bytes_are_rows_or_a_one_line_error(data, suffix, gzipped):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"rows{suffix}"
        path.write_bytes(gzip.compress(data) if gzipped and suffix.endswith(".gz") else data)

        def read():
            files = resolve([path])
            count_records(files)
            for record in iter_records(files, max_row_bytes=64):
                if record.oversized is None:
                    conversation_from_row(record.parse(), record.where)

        _only_one_line_errors(read, str(path))
