"""generate's settings: one BaseModel in generate/config.py; bad retry timings are refused up front."""

from __future__ import annotations

import pytest

from draftsmith.cli import main


@pytest.mark.parametrize("flag,value,message", [
    ("--backoff-max-s", "inf", "--backoff-max-s: must be a finite number (got inf)"),
    ("--backoff-max-s", "nan", "--backoff-max-s: Input should be greater than or equal to 0 (got nan)"),
    ("--backoff-base-s", "-1", "--backoff-base-s: Input should be greater than or equal to 0 (got -1.0)"),
    ("--timeout", "0", "--timeout: Input should be greater than 0 (got 0.0)"),
])  # fmt: skip
def test_a_retry_timing_that_cannot_be_slept_is_one_line_and_exit_2(tmp_path, capsys, flag, value, message):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    out = tmp_path / "out"
    assert main(["generate", str(prompts), "-o", str(out), flag, value]) == 2
    assert capsys.readouterr().err.strip() == f"draftsmith: error: {message}"
    assert not out.exists()  # refused before anything is written


def test_guard_settings_nest_and_copy():
    from draftsmith.generate import GenerateConfig, GuardConfig

    config = GenerateConfig(inputs=["p.jsonl"], output_dir="o", guard=GuardConfig(window=10))
    quiet = config.guard.model_copy(update={"expect_reasoning": False})
    assert (quiet.window, quiet.expect_reasoning, config.guard.expect_reasoning) == (10, False, True)
    with pytest.raises(ValueError):
        GenerateConfig(inputs=["p.jsonl"], output_dir="o", concurrency=0)
