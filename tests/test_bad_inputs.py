"""Every stage against bad input, as a user meets it: `python -m draftsmith ...` as a real process.

Each case must exit 2 with exactly one stderr line, `draftsmith: error: ...`, that names the file
(and line or sample where there is one) and the problem; never a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SRC = Path(__file__).resolve().parents[1] / "src"


def run_cli(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)  # fmt: skip


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    err = result.stderr
    assert "Traceback" not in err, err
    assert result.returncode == 2, (result.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _prompt_row(text: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n"


def _conversation_row(text: str) -> str:
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "an answer to " + text}]
    return json.dumps({"id": text, "messages": messages}) + "\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_target_dir) -> dict[str, Path]:
    """One of each bad input, plus the good parts the stages need around it."""
    from draftsmith.model import DFlashDraftModel, build_drafter_config, save_drafter
    from draftsmith.train.target import load_target_config

    root = tmp_path_factory.mktemp("bad")
    paths = {"root": root, "target": tiny_target_dir}
    paths["empty"] = root / "empty.jsonl"
    paths["empty"].write_text("")
    paths["a_file"] = root / "a_file"
    paths["a_file"].write_text("not a directory\n")
    paths["prompts"] = root / "prompts.jsonl"
    paths["prompts"].write_text(_prompt_row("one") + _prompt_row("two"))
    paths["conversations"] = root / "conversations.jsonl"
    paths["conversations"].write_text(_conversation_row("one") + _conversation_row("two"))

    torch.manual_seed(0)
    config = build_drafter_config(load_target_config(tiny_target_dir), num_draft_layers=1, block_size=4, mask_token_id=3)
    paths["drafter"] = save_drafter(DFlashDraftModel(config), root / "drafter")
    truncated = root / "truncated-drafter"
    truncated.mkdir()
    (truncated / "config.json").write_bytes((paths["drafter"] / "config.json").read_bytes())
    weights = (paths["drafter"] / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    paths["truncated_drafter"] = truncated
    return paths


def _cases() -> list[tuple[str, list[str], tuple[str, ...]]]:
    # Arguments name fixture files as "{key}"; the expected fragments may too.
    return [
        ("plan: a decimal comma", ["plan", "--samples", "914000", "--output-mean", "2500", "--throughput", "1,5k tok/s"],
         ("'1,5' is ambiguous", "decimal point or a thousands separator")),
        ("generate: empty input", ["generate", "{empty}", "-o", "{root}/gen-empty", "--no-progress"],
         ("{empty}: no prompts",)),
        ("tokenize: missing --tokenizer dir", ["tokenize", "{conversations}", "-t", "{root}/no-such-tokenizer", "-o", "{root}/tok-x"],
         ("--tokenizer {root}/no-such-tokenizer: no such directory",)),
        ("eval: missing --target dir", ["eval", "--target", "{root}/no-such-target", "--drafter", "{drafter}", "--prompts", "{prompts}"],
         ("--target {root}/no-such-target: no such directory",)),
        ("export: truncated model.safetensors", ["export", "--drafter", "{truncated_drafter}", "--out", "{root}/export-x"],
         ("{truncated_drafter}/model.safetensors: not a readable safetensors file",)),
        ("eval: truncated model.safetensors", ["eval", "--target", "{target}", "--drafter", "{truncated_drafter}", "--prompts", "{prompts}"],
         ("{truncated_drafter}/model.safetensors: not a readable safetensors file",)),
    ]  # fmt: skip


CASES = _cases()


@pytest.mark.parametrize("name, args, fragments", CASES, ids=[case[0] for case in CASES])
def test_bad_input_is_one_line_and_exit_2(files, name, args, fragments):
    fill = {key: str(value) for key, value in files.items()}
    result = run_cli([arg.format(**fill) for arg in args])
    assert_one_line_error(result, *(fragment.format(**fill) for fragment in fragments))


def test_ctrl_c_says_interrupted(tmp_path, files):
    env = dict(os.environ, PYTHONPATH=str(SRC))
    process = subprocess.Popen(
        [sys.executable, "-m", "draftsmith", "generate", str(files["prompts"]), "-o", str(tmp_path / "out"),
         "-e", "http://127.0.0.1:9", "--no-progress"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    # The run reports its (closed) endpoint down and waits for it; interrupt it there.
    first = process.stderr.readline()
    assert "http://127.0.0.1:9" in first, first
    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=60)[1]
    assert process.returncode == 130
    assert rest.strip().splitlines()[-1] == "draftsmith: interrupted" and "Traceback" not in rest
