"""Rows that must never become training data are skipped and counted, never trained; rows in the
forms function-calling datasets use are read; bad input is a one-line exit-2 error. Through the
real CLI in a subprocess (`python -m draftsmith tokenize`), as a user runs it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.data.tokenized import read_shard
from draftsmith.tiny import synthetic_conversations
from chat_templates import tool_call_template
from tokenize_helpers import save_tokenizer_with_template, write_jsonl

SRC = str(Path(__file__).resolve().parents[2] / "src")
# The tiny template, refusing one kind of row the way real templates do (`raise_exception`).
RAISING_TEMPLATE = (
    '{%- if messages[0].content == "boom" -%}{{- raise_exception("Conversation roles must alternate") -}}{%- endif -%}'
    + tool_call_template()  # renders the function-call row's tool call, so only the planted rows drop
)


def run_tokenize(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "draftsmith", "tokenize", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def answer(content, **fields):
    return {"role": "assistant", "content": content, **fields}


def user(text):
    return {"role": "user", "content": text}


def bad_rows():
    """Rows no run may train, each with why."""
    return [
        # A stream cut off before its finish_reason and [DONE]: what it has is not the whole answer.
        {"id": "cut-off", "messages": [user("Spell dog."), answer("d o")], "finish_reason": None},
        {"id": "null-content", "messages": [user("Spell cat."), answer(None)], "finish_reason": "stop"},
        {"id": "number-content", "messages": [user("Add 2 and 2."), answer(4)], "finish_reason": "stop"},
        {"id": "aborted", "messages": [user("Spell owl."), answer("o w")], "finish_reason": "abort"},
    ]


def function_calling_rows():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    return [
        # `tools` as JSON text, as many function-calling datasets store it.
        {"id": "tools-as-text", "tools": json.dumps([tool]), "messages": [user("Weather in Rome?"), answer("Sunny.")]},
        # A ShareGPT function_call turn: a tool call, then its observation, then the answer.
        {"id": "function-call", "conversations": [
            {"from": "human", "value": "Weather in Oslo?"},
            {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
            {"from": "observation", "value": "rain"},
            {"from": "gpt", "value": "It rains in Oslo."}]},
    ]


def test_bad_rows_are_skipped_and_counted_and_the_run_goes_on(tmp_path, tiny_target_dir):
    tokenizer = save_tokenizer_with_template(tiny_target_dir, RAISING_TEMPLATE, tmp_path / "tok")
    good = list(synthetic_conversations(12, seed=5))
    raising = {"id": "template-raises", "messages": [user("boom"), answer("Bang.")]}
    rows = good[:6] + bad_rows() + [raising] + function_calling_rows() + good[6:]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out"
    done = run_tokenize(source, "-t", tokenizer, "-o", out, "--workers", "2", "--chunk-size", "3",
                        "--no-progress", "--max-error-share", "0.5", "--no-audit")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads((out / "tokenize_summary.json").read_text())
    assert summary["dropped"] == {"incomplete_answer": 4, "template_error": 1}
    assert summary["written"] == 14 and summary["input_rows"] == 19
    examples = summary["examples"]
    assert "finish_reason is null" in examples["incomplete_answer"][0] and "(cut-off)" in examples["incomplete_answer"][0]
    assert examples["template_error"] == [
        f"{source}:11 (template-raises): the chat template raised TemplateError: Conversation roles must alternate"
    ]
    table = read_shard(out / "part-00000.arrow")
    ids = table.column("id").to_pylist()
    assert {"cut-off", "null-content", "number-content", "aborted", "template-raises"}.isdisjoint(ids)
    assert {"tools-as-text", "function-call"} <= set(ids)


def test_a_function_call_turn_renders_as_a_tool_call(tmp_path, tiny_target_dir):
    from transformers import AutoTokenizer

    tokenizer = save_tokenizer_with_template(tiny_target_dir, tool_call_template(), tmp_path / "tok")
    source = write_jsonl(tmp_path / "rows.jsonl", function_calling_rows()[1:])
    done = run_tokenize(source, "-t", tokenizer, "-o", tmp_path / "out", "--workers", "1", "--no-progress", "--no-audit")
    assert done.returncode == 0, done.stderr
    input_ids = read_shard(tmp_path / "out" / "part-00000.arrow").column("input_ids").to_pylist()[0]
    text = AutoTokenizer.from_pretrained(tokenizer).decode(input_ids)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in text
    assert '"get_weather", "arguments"' in text and '<|im_start|>assistant\n{"name"' not in text



def test_a_tool_call_the_template_cannot_render_is_dropped_and_counted(tmp_path, tiny_target_dir):
    # The tiny target's template has no tool_calls branch: the function_call turn rendered as an
    # empty assistant message and the row was written without a word.
    rows = function_calling_rows()[1:] + list(synthetic_conversations(3, seed=2))
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out"
    done = run_tokenize(source, "-t", tiny_target_dir, "-o", out, "--workers", "1", "--no-progress", "--no-audit",
                        "--max-error-share", "0.5")  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    summary = json.loads((out / "tokenize_summary.json").read_text())
    assert summary["dropped"] == {"tool_calls_not_rendered": 1} and summary["errors"] == 1
    assert summary["written"] == 3
    assert summary["examples"]["tool_calls_not_rendered"] == [
        f"{source}:1 (function-call): turn 1: the chat template does not render the tool "
        "call 'get_weather', so the call would be lost from the training text (is this the target model's own "
        "template? it must render tool_calls)"]

def _invalid_utf8_array(path):
    path.write_bytes(b'[\n  {"id": "a", "messages": []},\n  {"id": "b\xff"}\n]\n')
    return path, f"{path}:3: not valid UTF-8 (byte 44 of the file: b'\\xff\"}}\\n'); JSON must be UTF-8", ()


def _lone_surrogate(path):
    path = path.with_suffix(".jsonl")
    path.write_text('{"id": "s1", "messages": [{"role": "user", "content": "bad \\ud800"}, '
                    '{"role": "assistant", "content": "ok"}]}\n')
    return path, (f"{path}:1: malformed string in messages[0].content: a lone UTF-16 surrogate '\\ud800' at "
                  "character 4 (text must be valid Unicode)"), ()


def _split_on_jsonl(path):
    path = write_jsonl(path.with_suffix(".jsonl"), list(synthetic_conversations(2, seed=1)))
    return path, (f"{path}: --split 'test' chooses a split of a DatasetDict (a datasets.save_to_disk directory "
                  "with splits), and no input is one; drop --split"), ("--split", "test")


def _tools_not_json(path):
    path = write_jsonl(path.with_suffix(".jsonl"), [{"id": "t", "tools": "get_weather(city)",
                                                     "messages": [user("q"), answer("a")]}])
    return path, (f"{path}:1: 'tools' must be a list of objects, or that list as JSON text; got a string that is "
                  "not JSON (Expecting value)"), ()


@pytest.mark.parametrize("make", [_invalid_utf8_array, _lone_surrogate, _split_on_jsonl, _tools_not_json],
                         ids=lambda make: make.__name__.strip("_"))
def test_bad_input_is_one_line_and_exit_2(tmp_path, tiny_target_dir, make):
    source, message, extra = make(tmp_path / "rows.json")
    done = run_tokenize(source, "-t", tiny_target_dir, "-o", tmp_path / "out", "--workers", "1", "--no-progress", *extra)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"draftsmith: error: {message}"]
    assert done.stdout == ""


def test_the_manifest_records_the_template_and_its_kwargs(tmp_path, tiny_target_dir, tiny_tokenizer):
    source = write_jsonl(tmp_path / "rows.jsonl", list(synthetic_conversations(3, seed=1)))
    done = run_tokenize(source, "-t", tiny_target_dir, "-o", tmp_path / "out", "--workers", "1", "--no-progress",
                        "--no-audit", "--template-arg", "enable_thinking=true")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["template"] == {
        "sha256": hashlib.sha256(tiny_tokenizer.chat_template.encode("utf-8")).hexdigest(),
        "kwargs": {"enable_thinking": True},
    }
    assert manifest["complete"] is True
    assert "tokenize: thinking on (as asked; enable_thinking=true): the chat template has a thinking switch" in " ".join(
        done.stderr.split())


def test_a_broken_generation_config_of_the_tokenizer_is_one_line_and_exit_2(tmp_path, tiny_target_dir):
    # Its eos ids are end-of-turn tokens: the file was read with json.loads and gave a traceback.
    import shutil

    tokenizer = tmp_path / "target"
    shutil.copytree(tiny_target_dir, tokenizer)
    (tokenizer / "generation_config.json").write_text("not json")
    source = write_jsonl(tmp_path / "rows.jsonl", list(synthetic_conversations(2, seed=1)))
    done = run_tokenize(source, "-t", tokenizer, "-o", tmp_path / "out", "--no-progress", "--no-audit")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    assert lines[0] == f"draftsmith: error: {tokenizer / 'generation_config.json'}:1: invalid JSON (Expecting value)"
