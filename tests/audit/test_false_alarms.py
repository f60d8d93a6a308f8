"""Issue 17's audit false alarms: each gate has one definition across both audits, and honest data
passes it. Every test here failed before its fix."""

from __future__ import annotations

import json

from draftsmith.audit import audit_conversations, audit_tokenized
from draftsmith.cli import main
from draftsmith.data.tokenized import SUMMARY_NAME, write_tokenized

from .conftest import tokenize_conversation, write_jsonl
from .test_conversations import generated_rows


def test_a_tokenize_output_directory_is_audited_as_tokenized(tmp_path, clean_rows, capsys):
    out = tmp_path / "runs" / "demo" / "tokenized"
    write_tokenized(clean_rows[:40], out, shard_rows=16)
    (out / "manifest.json").write_text(json.dumps({"stage": "tokenize", "complete": True}))
    (out / SUMMARY_NAME).write_text(json.dumps({"written": 40, "shards": ["part-00000.arrow"]}))
    assert main(["audit", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines()[-1].startswith("PASS: 40 tokenized samples audited"), captured


def test_a_final_turn_of_only_tool_calls_is_not_an_empty_response(tmp_path):
    rows = generated_rows(20)
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    for index in range(0, 20, 2):
        rows[index]["messages"][-1] = {"role": "assistant", "content": "", "tool_calls": [dict(call, id=f"c{index}")]}
    report = audit_conversations(write_jsonl(rows, tmp_path / "tools.jsonl"))
    assert report.checks["empty_response"].count == 0
    assert "empty_response" not in {gate.name for gate in report.failed_gates}


def _rows(tokenizer, conversations, *, enable_thinking: bool):
    rows = []
    for conversation in conversations:
        input_ids, loss_mask = tokenize_conversation(tokenizer, conversation["messages"], enable_thinking=enable_thinking)
        rows.append({"id": conversation["id"], "input_ids": input_ids, "loss_mask": loss_mask})
    return rows


def test_an_untrained_template_think_block_is_no_thinking_not_empty_thinking(tmp_path, tiny_tokenizer, tiny_target_dir):
    """Thinking switched off: the template puts an empty think block in the (untrained) prompt."""
    conversations = [dict(row) for row in generated_rows(30)]
    for row in conversations:
        answer = row["messages"][-1]
        row["messages"] = row["messages"][:-1] + [{"role": "assistant", "content": answer["content"]}]
    rows = _rows(tiny_tokenizer, conversations, enable_thinking=False)
    think = tiny_tokenizer.convert_tokens_to_ids("<think>")
    assert all(think in row["input_ids"] for row in rows)  # the block is there, untrained
    report = audit_tokenized(write_tokenized(rows, tmp_path / "tok")[0].parent, tokenizer=tiny_target_dir)
    assert report.checks["empty_thinking"].count == 0
    assert report.checks["no_thinking"].count == 30
    conversation_report = audit_conversations(write_jsonl(conversations, tmp_path / "rows.jsonl"))
    assert conversation_report.checks["empty_thinking"].count == 0  # the same definition on the same rows
    assert conversation_report.checks["no_thinking"].count == 30


def test_one_honest_empty_think_in_a_small_set_passes_both_audits(tmp_path, tiny_tokenizer, tiny_target_dir):
    conversations = generated_rows(3)
    conversations[1]["messages"][-1] = dict(conversations[1]["messages"][-1], reasoning_content="")
    conversation_report = audit_conversations(write_jsonl(conversations, tmp_path / "rows.jsonl"))
    rows = _rows(tiny_tokenizer, conversations, enable_thinking=True)
    tokenized_report = audit_tokenized(write_tokenized(rows, tmp_path / "tok")[0].parent, tokenizer=tiny_target_dir)
    for report in (conversation_report, tokenized_report):
        assert report.checks["empty_thinking"].count == 1
        assert report.passed, report.verdict
    # Five rows of empty thinking in a small set are a pattern: still a failure.
    many = generated_rows(6)
    for row in many[:5]:
        row["messages"][-1] = dict(row["messages"][-1], reasoning_content="")
    assert "empty_thinking" in {gate.name for gate in audit_conversations(write_jsonl(many, tmp_path / "many.jsonl")).failed_gates}


def test_sampling_each_prompt_several_times_is_not_duplicate_prompts(tmp_path, tiny_tokenizer, tiny_target_dir):
    base = generated_rows(10)
    samples = []
    for row in base:
        for sample in range(4):  # four samples of each prompt, each its own id and answer
            answer = dict(row["messages"][-1], content=f"{row['messages'][-1]['content']} (sample {sample})")
            samples.append(dict(row, id=f"{row['id']}-s{sample}", sample_index=sample, messages=row["messages"][:-1] + [answer]))
    conversation_report = audit_conversations(write_jsonl(samples, tmp_path / "rows.jsonl"))
    rows = _rows(tiny_tokenizer, samples, enable_thinking=True)
    tokenized_report = audit_tokenized(write_tokenized(rows, tmp_path / "tok")[0].parent, tokenizer=tiny_target_dir)
    for report in (conversation_report, tokenized_report):
        assert report.checks["duplicate_prompts"].count == 0
        assert report.passed, report.verdict
    # The same prompt with the same completion again is a duplicate, in both.
    again = samples + samples[:30]
    again = [dict(row, id=f"{row['id']}-{index}") for index, row in enumerate(again)]
    doubled = audit_conversations(write_jsonl(again, tmp_path / "again.jsonl"))
    tokenized_doubled = audit_tokenized(
        write_tokenized(rows + [dict(row, id=f"{row['id']}-again") for row in rows[:30]], tmp_path / "tok2")[0].parent
    )
    assert doubled.checks["duplicate_prompts"].count == 30 == tokenized_doubled.checks["duplicate_prompts"].count
