"""`generate` against `draftsmith serve --model <tiny target>`: real generation, reasoning, token ids."""

from __future__ import annotations

import pytest

from draftsmith.generate import GenerateConfig, generate
from draftsmith.serve.process import ServeProcess

from .conftest import assert_exactly_once


@pytest.mark.parametrize("reasoning_field, stream", [("reasoning", False), ("reasoning_content", True)])
def test_tiny_generation_keeps_reasoning_and_token_ids(tmp_path, prompts_file, tiny_target_dir, tiny_tokenizer,
                                                       reasoning_field, stream):
    prompts = prompts_file(6)
    args = ["--model", str(tiny_target_dir), "--served-model-name", "tiny", "--reasoning-field", reasoning_field,
            "--batch-wait-ms", "50"]
    with ServeProcess(args) as server:
        summary = generate(GenerateConfig(
            inputs=[prompts], output_dir=tmp_path / "out", endpoints=[server.url], max_tokens=96,
            temperature=0.0, progress=False, stream=stream, concurrency=8))
    assert summary.ok, summary.problems()
    rows = assert_exactly_once(tmp_path / "out", prompts)
    think_end = tiny_tokenizer.convert_tokens_to_ids("</think>")
    for row in rows:
        prompt_messages, answer = row["messages"][:-1], row["messages"][-1]
        text = tiny_tokenizer.apply_chat_template(prompt_messages, tokenize=False, add_generation_prompt=True,
                                                  enable_thinking=True)
        assert row["prompt_token_ids"] == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = row["completion_token_ids"]
        assert row["completion_tokens"] == len(ids) and row["prompt_tokens"] == len(row["prompt_token_ids"])
        assert row["model"] == "tiny"
        if row["finish_reason"] == "stop":
            assert ids[-1] == tiny_tokenizer.eos_token_id and think_end in ids
            assert answer["reasoning_content"] and answer["content"]
            assert row["reasoning_tokens"] == ids.index(think_end) + 1
            decoded = tiny_tokenizer.decode(ids, skip_special_tokens=True)
            assert answer["reasoning_content"] in decoded and answer["content"] in decoded
    assert sum(row["finish_reason"] == "stop" for row in rows) >= 4
