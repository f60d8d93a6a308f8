"""Readers: every input format of contract 1, ShareGPT, and errors that name file and line."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.core.errors import InputError
from draftsmith.tokenize.readers import count_rows, expand_inputs, iter_records, normalize_row
from tokenize_helpers import write_jsonl

ROW = {
    "id": "a1",
    "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
    ],
    "finish_reason": "stop",
}


def read_all(paths):
    return [normalize_row(record) for record in iter_records(expand_inputs(paths))]


def test_jsonl_rows_keep_engine_fields(tmp_path):
    with_ids = {**ROW, "id": "a2", "prompt_token_ids": [1, 2], "completion_token_ids": [3, 4]}
    path = write_jsonl(tmp_path / "rows.jsonl", [ROW, "", with_ids])
    rows = read_all([path])
    assert [row["id"] for row in rows] == ["a1", "a2"]
    assert rows[0]["where"] == f"{path}:1" and rows[1]["where"] == f"{path}:3"
    assert rows[1]["prompt_token_ids"] == [1, 2] and rows[1]["completion_token_ids"] == [3, 4]
    assert rows[0]["messages"][-1]["reasoning_content"] == "Greet back."
    assert count_rows(expand_inputs([path])) == 2


def test_sharegpt_conversations_and_inline_thinking(tmp_path):
    sharegpt = {
        "id": "s1",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "<think>\nGreet back.\n</think>\n\nHello."},
        ],
    }
    rows = read_all([write_jsonl(tmp_path / "sharegpt.jsonl", [sharegpt])])
    messages = rows[0]["messages"]
    assert [message["role"] for message in messages] == ["system", "user", "assistant"]
    assert messages[-1]["content"] == "Hello." and messages[-1]["reasoning_content"] == "Greet back."


def test_vllm_reasoning_field_and_content_parts(tmp_path):
    row = {
        "id": "v1",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "Hello.", "reasoning": "Greet back.", "tool_calls": None},
        ],
    }
    messages = read_all([write_jsonl(tmp_path / "v.jsonl", [row])])[0]["messages"]
    assert messages[0]["content"] == "Hi there"
    assert messages[1]["reasoning_content"] == "Greet back." and "tool_calls" not in messages[1]


def test_parquet_arrow_and_datasets_dirs(tmp_path):
    from datasets import Dataset

    table = pa.Table.from_pylist([ROW, {**ROW, "id": "a2"}])
    pq.write_table(table, tmp_path / "rows.parquet")
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    Dataset.from_list([ROW, {**ROW, "id": "a3"}]).save_to_disk(str(tmp_path / "hf"))
    assert [row["id"] for row in read_all([tmp_path / "rows.parquet"])] == ["a1", "a2"]
    assert [row["id"] for row in read_all([tmp_path / "rows.arrow"])] == ["a1", "a2"]
    hf_rows = read_all([tmp_path / "hf"])
    assert [row["id"] for row in hf_rows] == ["a1", "a3"]
    assert hf_rows[0]["messages"][-1]["reasoning_content"] == "Greet back."
    assert count_rows(expand_inputs([tmp_path / "hf", tmp_path / "rows.parquet"])) == 4
    assert read_all([tmp_path / "rows.parquet"])[1]["where"] == f"{tmp_path / 'rows.parquet'} row 1"


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "x", "messages": [', "invalid JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
        ('{"messages": [{"role": "user", "content": "Hi"}]}', "missing or empty string field 'id'"),
        ('{"id": "x"}', "neither 'messages' nor 'conversations'"),
        ('{"id": "x", "messages": [{"role": "wizard", "content": "Hi"}]}', "unknown role 'wizard'"),
        ('{"id": "x", "messages": [{"role": "user", "content": 5}]}', "content must be a string"),
        ('{"id": "x", "conversations": [{"from": "alien", "value": "Hi"}]}', "unknown speaker 'alien'"),
        ('{"id": "x", "messages": [{"role": "user", "content": "Hi"}], "prompt_token_ids": ["a"]}', "list of integers"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [json.dumps(ROW), line])
    with pytest.raises(InputError) as caught:
        read_all([path])
    assert f"{path}:2" in str(caught.value) and message in str(caught.value)


def test_missing_and_unknown_inputs(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        expand_inputs([tmp_path / "nope.jsonl"])
    (tmp_path / "rows.csv").write_text("id,messages\n")
    with pytest.raises(InputError, match="unknown input format"):
        expand_inputs([tmp_path / "rows.csv"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no"):
        expand_inputs([tmp_path / "empty"])
