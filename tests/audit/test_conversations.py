from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.audit import audit_conversations
from draftsmith.core.errors import InputError
from draftsmith.tiny import synthetic_conversations

from .conftest import write_jsonl


def generated_rows(count: int, *, seed: int = 1, boilerplate_share: float = 0.0):
    rows = []
    for index, row in enumerate(synthetic_conversations(count, seed=seed)):
        row = dict(row, finish_reason="stop", model="tiny", endpoint="http://127.0.0.1:1/v1")
        if index < round(count * boilerplate_share):
            row["messages"] = row["messages"][:-1] + [
                {"role": "assistant", "content": "OK.", "reasoning_content": ""}
            ]
        rows.append(row)
    return rows


def test_boilerplate_conversations_fail(tmp_path):
    path = write_jsonl(generated_rows(200, boilerplate_share=0.87), tmp_path / "gen.jsonl")
    report = audit_conversations([path])
    assert not report.passed
    assert report.dominant_span.text == "OK."
    assert report.dominant_span.count == 174
    assert report.checks["empty_thinking"].count == 174
    failed = {gate.name for gate in report.failed_gates}
    assert {"dominant_span", "empty_thinking"} <= failed
    assert "87.0% of samples (174) train on the identical completion 'OK.'" in report.verdict


def test_a_small_healthy_set_passes_and_small_boilerplate_still_fails(tmp_path, tiny_tokenizer):
    # Five varied rows: every completion is seen once, which is not dominance.
    healthy = write_jsonl(generated_rows(5), tmp_path / "healthy.jsonl")
    for tokenizer in (None, tiny_tokenizer):
        report = audit_conversations(healthy, tokenizer=tokenizer)
        assert report.samples == 5 and report.dominant_span.count == 1
        assert report.passed, report.verdict
    # Five copies of the same stock reply repeat: still dominant.
    report = audit_conversations(write_jsonl(generated_rows(5, boilerplate_share=1.0), tmp_path / "bad.jsonl"))
    assert "dominant_span" in {gate.name for gate in report.failed_gates}
    assert "100.0% of samples (5) train on the identical completion 'OK.'" in report.verdict


def test_clean_conversations_pass(tmp_path, tiny_tokenizer):
    path = write_jsonl(generated_rows(200), tmp_path / "gen.jsonl")
    report = audit_conversations(path)
    assert report.passed, report.verdict
    assert report.length_unit == "chars"
    with_tokens = audit_conversations(path, tokenizer=tiny_tokenizer)
    assert with_tokens.passed, with_tokens.verdict
    assert with_tokens.length_unit == "tokens"
    assert with_tokens.checks["over_context"].checked
    rows = generated_rows(200)
    expected = 0
    for row in rows:
        text = tiny_tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
        prompt = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = row["messages"][-1]
        completion = f"<think>\n{answer['reasoning_content']}\n</think>\n\n{answer['content']}"
        expected += len(prompt) + len(tiny_tokenizer(completion, add_special_tokens=False)["input_ids"]) > 60
    tight = audit_conversations(path, tokenizer=tiny_tokenizer, max_context=60)
    assert 0 < tight.checks["over_context"].count == expected


def test_malformed_lines_are_reported_and_counted(tmp_path):
    lines = [json.dumps(row) for row in generated_rows(60)]
    lines.insert(4, '{"id": "cut", "messages": [{"role": "user"')
    lines.insert(10, '{"id": "nothing-here"}')
    lines.insert(20, '["not", "an", "object"]')
    lines.insert(30, json.dumps({"id": "no-answer", "messages": [{"role": "user", "content": "hi"}]}))
    path = write_jsonl(lines, tmp_path / "broken.jsonl")

    report = audit_conversations(path)
    assert report.samples == 64
    assert report.bad_samples == 4
    assert report.audited_samples == 60
    assert report.errors[0].startswith(f"{path}:5: invalid JSON")
    assert report.errors[1] == f"{path}:11: row has neither 'messages' nor 'conversations'"
    assert report.errors[2] == f"{path}:21: expected a JSON object, got list"
    assert report.errors[3] == f"{path}:31: row 'no-answer' has no assistant turn"
    assert [gate.name for gate in report.failed_gates] == ["bad_samples"]
    assert audit_conversations(path, thresholds={"bad_samples": 0.1}).passed


def test_sharegpt_and_parquet_inputs(tmp_path):
    rows = generated_rows(80)
    sharegpt = []
    for row in rows:
        turns = []
        for message in row["messages"]:
            speaker = {"user": "human", "assistant": "gpt", "system": "system"}[message["role"]]
            turns.append({"from": speaker, "value": message["content"]})
        sharegpt.append({"id": row["id"], "conversations": turns})
    path = write_jsonl(sharegpt, tmp_path / "sharegpt.jsonl")
    report = audit_conversations(path)
    assert report.samples == 80 and report.bad_samples == 0
    assert report.checks["no_thinking"].count == 80  # ShareGPT carries no reasoning

    parquet = tmp_path / "gen.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    from_parquet = audit_conversations(parquet).to_dict()
    from_jsonl = audit_conversations(write_jsonl(rows, tmp_path / "gen.jsonl")).to_dict()
    for key in ("samples", "trainable", "dominant", "passed"):
        assert from_parquet[key] == from_jsonl[key]


def test_generation_problems_are_counted(tmp_path):
    rows = generated_rows(100)
    rows[0]["finish_reason"] = "length"
    rows[1]["finish_reason"] = "abort"
    rows[2]["messages"][-1] = {"role": "assistant", "content": "<think>\nstill going"}
    rows[3]["messages"][-1] = {"role": "assistant", "content": "<think>\n\n</think>\n\n   "}
    rows[4].update(prompt_tokens=3000, completion_tokens=2000)
    rows[5]["messages"] = rows[6]["messages"]
    path = write_jsonl(rows, tmp_path / "gen.jsonl")
    report = audit_conversations(path, max_context=4096)
    checks = report.checks
    assert checks["truncated"].example_ids == [rows[0]["id"]]
    assert checks["missing_end_of_turn"].example_ids == [rows[1]["id"], rows[2]["id"]]
    assert checks["unclosed_thinking"].example_ids == [rows[2]["id"]]
    assert rows[3]["id"] in checks["empty_response"].example_ids
    assert rows[3]["id"] in checks["empty_thinking"].example_ids
    assert checks["over_context"].example_ids == [rows[4]["id"]]
    assert rows[6]["id"] in checks["duplicate_prompts"].example_ids
    assert rows[6]["id"] in checks["duplicate_completions"].example_ids
    assert not report.passed


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        audit_conversations(tmp_path / "nope.jsonl")


def test_repeated_ids_fail(tmp_path):
    rows = generated_rows(30)
    rows[20]["id"] = rows[2]["id"]
    report = audit_conversations([write_jsonl(rows, tmp_path / "gen.jsonl")])
    assert report.checks["repeated_ids"].count == 1 and report.checks["repeated_ids"].example_ids == [rows[2]["id"]]
    assert "repeated_ids" in [gate.name for gate in report.failed_gates]
    assert audit_conversations([write_jsonl(generated_rows(30), tmp_path / "ok.jsonl")]).checks["repeated_ids"].count == 0
