"""One fixture matrix of row formats and file kinds, run through every stage that reads rows.

generate's input (`load_prompts`), audit (`audit_conversations`), tokenize (`tokenize_dataset`,
with the tiny target's tokenizer) and eval's prompts (`read_prompts`) must accept and reject the
same rows, extract the same conversation and give the same one-line error for a rejected row.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.audit import audit_conversations
from draftsmith.core.errors import InputError
from draftsmith.data.conversation import content_hash_id
from draftsmith.data.tokenized import read_shard
from draftsmith.data.sources import iter_records, resolve
from draftsmith.evaluate import read_prompts
from draftsmith.generate import load_prompts
from draftsmith.tokenize import TokenizeOptions, tokenize_dataset
from draftsmith.tokenize.pipeline import masker_row

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city"}}
SYSTEM = {"role": "system", "content": "Be brief."}


def case(row, prompt, reasoning, answer, tools=None, unclosed=False):
    return {"row": row, "prompt": prompt, "reasoning": reasoning, "answer": answer, "tools": tools, "unclosed": unclosed}


def user(text):
    return {"role": "user", "content": text}


# Each valid row: the prompt every prompt reader must extract, and the final answer's reasoning
# (None: the row carries none) and content every completion reader must see.
CASES = {
    "messages": case(
        {"id": "m1", "messages": [SYSTEM, user("Add 2 and 3."), {"role": "assistant", "content": "5.", "reasoning_content": "2+3=5"}]},
        [SYSTEM, user("Add 2 and 3.")], "2+3=5", "5.",
    ),
    "sharegpt_speaker_case": case(
        {"conversations": [{"from": "System", "value": "Be brief."}, {"from": "HUMAN", "value": "Name a colour."},
                           {"from": "GPT", "value": "Blue."}]},
        [SYSTEM, user("Name a colour.")], None, "Blue.",
    ),
    "sharegpt_tool_turns": case(
        {"id": "t1", "conversations": [{"from": "human", "value": "Weather in Oslo?"},
                                       {"from": "function_call", "value": '{"name": "get_weather"}'},
                                       {"from": "observation", "value": "rain"},
                                       {"from": "chatgpt", "value": "It rains."}]},
        # The function_call turn is the call the model made: a tool call, not text.
        [user("Weather in Oslo?"),
         {"role": "assistant", "content": "",
          "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {}}}]},
         {"role": "tool", "content": "rain"}], None, "It rains.",
    ),
    "sharegpt_reasoning_content": case(
        {"id": "s2", "conversations": [{"from": "user", "value": "Spell cat backwards."},
                                       {"from": "assistant", "value": "tac", "reasoning_content": "c-a-t reversed is t-a-c"}]},
        [user("Spell cat backwards.")], "c-a-t reversed is t-a-c", "tac",
    ),
    "sharegpt_reasoning": case(
        {"id": "s3", "conversations": [{"from": "human", "value": "Double 4."},
                                       {"from": "model", "value": "8", "reasoning": "4 times 2 is 8"}]},
        [user("Double 4.")], "4 times 2 is 8", "8",
    ),
    "specforge_role_content": case(
        {"id": "sf1", "conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                                        {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital is Paris"}]},
        [SYSTEM, user("Capital of France?")], "France's capital is Paris", "Paris.",
    ),
    "messages_reasoning_field": case(
        {"id": "r1", "messages": [user("Halve 10."), {"role": "assistant", "content": "5", "reasoning": "10 over 2"}]},
        [user("Halve 10.")], "10 over 2", "5",
    ),
    "inline_think": case(
        {"id": "i1", "messages": [user("Is 7 prime?"), {"role": "assistant", "content": "<think>\nno divisors\n</think>\n\nYes."}]},
        [user("Is 7 prime?")], "no divisors", "Yes.",
    ),
    "unclosed_think": case(
        {"id": "u1", "messages": [user("Count to 3."), {"role": "assistant", "content": "<think>\none, two"}],
         "finish_reason": "length"},
        [user("Count to 3.")], "one, two", "", unclosed=True,
    ),
    "tools": case(
        {"id": "w1", "tools": [TOOL], "messages": [user("Weather in Rome?"), {"role": "assistant", "content": "Sunny."}]},
        [user("Weather in Rome?")], None, "Sunny.", tools=[TOOL],
    ),
}
PROMPT_ONLY = {"conversations": [{"from": "human", "value": "Just a prompt."}]}


def expected_id(name):
    row = CASES[name]["row"]
    return row["id"] if "id" in row else content_hash_id(CASES[name]["prompt"])


# -- writers for every file kind ---------------------------------------------------------------


def _jsonl(rows, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _jsonl_gz(rows, path):
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _json_array(rows, path):
    path.write_text(json.dumps(rows, indent=2))
    return path


def _table(rows):
    # pa.array unifies the keys of every row (from_pylist would keep the first row's only).
    return pa.Table.from_struct_array(pa.array(rows))


def _parquet(rows, path):
    pq.write_table(_table(rows), path)
    return path


def _arrow(rows, path):
    table = _table(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def _datasets_dir(rows, path):
    from datasets import Dataset

    Dataset(_table(rows)).save_to_disk(str(path))
    return path


def _dataset_dict(rows, path):
    from datasets import Dataset, DatasetDict

    # Only `train` is read: the decoy split must never reach any stage.
    decoy = [{"id": "decoy", "messages": [user("decoy"), {"role": "assistant", "content": "decoy"}]}]
    DatasetDict({"test": Dataset(_table(decoy)), "train": Dataset(_table(rows))}).save_to_disk(str(path))
    return path


def _nested_folder(rows, path):
    half = len(rows) // 2
    _jsonl(rows[:half], path / "a" / "part.jsonl")
    (path / "b" / "deeper").mkdir(parents=True)
    _jsonl_gz(rows[half:], path / "b" / "deeper" / "part.jsonl.gz")
    (path / "README.txt").write_text("not data")
    return path


KINDS = {
    "jsonl": (_jsonl, "rows.jsonl"),
    "jsonl.gz": (_jsonl_gz, "rows.jsonl.gz"),
    "json_array": (_json_array, "rows.json"),
    "parquet": (_parquet, "rows.parquet"),
    "arrow": (_arrow, "rows.arrow"),
    "datasets_dir": (_datasets_dir, "hf"),
    "dataset_dict": (_dataset_dict, "hf_dict"),
    "nested_folder": (_nested_folder, "folder"),
}


def _without_nulls(value):
    """Columnar kinds give every struct every key; a null field means 'absent' to every reader."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


@pytest.fixture(scope="module")
def tokenizer_dir(tiny_target_dir, tmp_path_factory):
    """The tiny target's tokenizer under a template that renders tool calls (the sharegpt_tool_turns
    case has one; under a template without them tokenize drops the row as tool_calls_not_rendered)."""
    from transformers import AutoTokenizer

    from chat_templates import tool_call_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    tokenizer.chat_template = tool_call_template()
    out = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_stage_reads_every_format_the_same_way(kind, tmp_path, tokenizer_dir):
    write, name = KINDS[kind]
    names = list(CASES)
    source = write([CASES[n]["row"] for n in names], tmp_path / name)
    ids = [expected_id(n) for n in names]

    # generate's input and eval's prompts: same ids, prompts and tools.
    samples, duplicates = load_prompts(source)
    prompts = read_prompts(source)
    assert duplicates == [] and [s.id for s in samples] == ids and [p.id for p in prompts] == ids
    for n, sample, prompt in zip(names, samples, prompts, strict=True):
        assert _without_nulls(sample.messages) == CASES[n]["prompt"], n
        assert prompt.messages == sample.messages and prompt.tools == sample.tools
        assert _without_nulls(sample.tools) == CASES[n]["tools"], n

    # tokenize reads the same conversation: id, final answer, reasoning and tools.
    rows = [masker_row(record) for record in iter_records(resolve(source))]
    assert [row["id"] for row in rows] == ids
    for n, row in zip(names, rows, strict=True):
        final = row["messages"][-1]
        assert (final["role"], final["content"], final.get("reasoning_content")) == (
            "assistant", CASES[n]["answer"], CASES[n]["reasoning"]), n
        assert _without_nulls(row["tools"]) == CASES[n]["tools"], n
    options = TokenizeOptions(workers=1, progress=False, length_policy="keep", max_error_share=0.0)
    summary = tokenize_dataset(source, tokenizer_dir, tmp_path / "tok", options)
    assert summary.written == len(names) and summary.dropped == {}
    table = read_shard(tmp_path / "tok" / "part-00000.arrow")
    assert table.column("id").to_pylist() == ids
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for n, input_ids, mask in zip(names, table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()):
        trained = tokenizer.decode(np.asarray(input_ids)[np.asarray(mask) == 1].tolist())
        # Reasoning a row carries is trained on, whatever field or form it came in.
        assert (CASES[n]["reasoning"] or "") in trained and CASES[n]["answer"] in trained, n

    # audit reads the same rows: every one audited, reasoning classified as the Conversation says.
    report = audit_conversations(source)
    assert (report.samples, report.bad_samples, report.errors) == (len(names), 0, [])
    checks = report.to_dict()["checks"]
    without_reasoning = sorted(expected_id(n) for n in names if CASES[n]["reasoning"] is None)
    assert checks["no_thinking"]["count"] == len(without_reasoning)
    assert checks["unclosed_thinking"]["count"] == 1
    assert checks["unclosed_thinking"]["example_ids"] == ["u1"]


# -- malformed rows ----------------------------------------------------------------------------

GOOD = CASES["messages"]["row"]
MALFORMED = {
    "bad_json": ('{"id": "x", "messages": [', "invalid JSON: Expecting value at column 27"),
    "missing_messages": ('{"id": "x", "text": 5}', "row has neither 'messages' nor 'conversations'"),
    "messages_number": ('{"id": "x", "messages": 5}', "'messages' must be a list, got int"),
    "unknown_speaker": ('{"id": "x", "conversations": [{"from": "alien", "value": "hi"}]}',
                        "conversations[0]: unknown speaker 'alien'"),
    "empty_conversation": ('{"id": "x", "conversations": []}', "'conversations' is empty"),
    "non_text_content": ('{"id": "x", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
                         "messages[0]: content part"),
    "tools_not_a_list": ('{"id": "x", "tools": "get_weather", "messages": [{"role": "user", "content": "hi"}]}',
                         "'tools' must be a list of objects"),
}


def _error(call):
    with pytest.raises(InputError) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_row_gets_the_same_one_line_error_from_every_stage(name, tmp_path, tokenizer_dir):
    line, problem = MALFORMED[name]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    generate_error = _error(lambda: load_prompts(path))
    eval_error = _error(lambda: read_prompts(path))
    options = TokenizeOptions(workers=1, progress=False)
    tokenize_error = _error(lambda: tokenize_dataset(path, tokenizer_dir, tmp_path / "tok", options))
    audit = audit_conversations(path)
    assert generate_error == eval_error == tokenize_error == audit.errors[0]
    assert "\n" not in generate_error and generate_error.startswith(f"{path}:2: ")
    assert problem in generate_error
    assert (audit.samples, audit.bad_samples) == (2, 1)


def test_a_row_without_an_answer_is_a_prompt_but_no_completion(tmp_path, tokenizer_dir):
    path = _jsonl([GOOD, PROMPT_ONLY], tmp_path / "rows.jsonl")
    prompt_id = content_hash_id([user("Just a prompt.")])
    assert [s.id for s in load_prompts(path)[0]] == ["m1", prompt_id]
    assert [p.id for p in read_prompts(path)] == ["m1", prompt_id]
    audit = audit_conversations(path)
    assert audit.errors == [f"{path}:2: row {prompt_id!r} has no assistant turn"]
    options = TokenizeOptions(workers=1, progress=False, max_error_share=1.0)
    summary = tokenize_dataset(path, tokenizer_dir, tmp_path / "tok", options)
    assert summary.written == 1 and summary.dropped == {"no_assistant_turn": 1}
