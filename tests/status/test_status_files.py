"""`draftsmith status` on what others may have left at a stage file's name: a FIFO or a link to a
device is one line (never a hang or a read without end), a damaged progress record one warning
line (the rows are read in full), a bad flag value refused, and lengths counted as the cap counts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import run_status


def _generate_dir(directory: Path, rows: list[int], max_tokens: int = 512) -> Path:
    """A generate output directory as generate leaves it: owner, manifest, one part of `rows` (output lengths)."""
    directory.mkdir()
    (directory / ".draftsmith-owner").write_text('{"stage": "generate"}\n')
    (directory / "manifest.json").write_text(json.dumps({"stage": "generate", "settings": {"max_tokens": max_tokens}}))
    lines = [json.dumps({"id": f"r{i}", "completion_tokens": tokens, "finish_reason": "length" if tokens >= max_tokens else "stop"})
             for i, tokens in enumerate(rows)]  # fmt: skip
    (directory / "generated-s0of1-0.jsonl").write_text("".join(line + "\n" for line in lines))
    return directory


def _train_dir(directory: Path) -> Path:
    directory.mkdir()
    (directory / ".draftsmith-owner").write_text('{"stage": "train"}\n')
    (directory / "train_log.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0, "total_steps": 4}) + "\n")
    return directory


def _one_line(code: int, stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("name", ["train_log.jsonl", "train_summary.json", "train_config.json", ".draftsmith.lock",
                                  ".draftsmith-owner"])  # fmt: skip
def test_a_fifo_at_a_train_file_name_is_one_line_not_a_hang(tmp_path, name):
    out = _train_dir(tmp_path / "run")
    (out / name).unlink(missing_ok=True)
    os.mkfifo(out / name)
    code, view, err = run_status(out)  # a hang fails here by the 60 s timeout
    assert view is None and f"{out / name}: not a regular file (a FIFO)" in _one_line(code, err)


@pytest.mark.parametrize("name", ["progress-s0of1.json", "summary-s0of1.json", "failures-s0of1.jsonl", ".draftsmith.s0of1.lock",
                                  "generated-s0of1-1.jsonl"])  # fmt: skip
def test_a_link_to_dev_zero_at_a_generate_file_name_is_one_line(tmp_path, name):
    out = _generate_dir(tmp_path / "gen", [10, 20])
    (out / name).symlink_to("/dev/zero")
    code, view, err = run_status(out)  # reading /dev/zero would fill memory until killed
    assert view is None and f"{out / name}: not a regular file (a character device)" in _one_line(code, err)


def test_a_damaged_progress_record_is_one_warning_and_the_rows_are_counted(tmp_path):
    out = _generate_dir(tmp_path / "gen", [10, 20, 30])
    record = {"kind": "generate-progress", "started_at": "yesterday", "input": 3, "parts": {}, "history": [],
              "rows_at_start": 0, "output_tokens_at_start": 0, "failures_start": 0}  # fmt: skip
    (out / "progress-s0of1.json").write_text(json.dumps(record))
    (out / "summary-s0of1.json").write_text(json.dumps({"input": 3, "failed": 0}))
    code, view, err = run_status(out)
    assert (code, view["state"], view["done"], view["total"], view["lengths"]["mean"]) == (0, "finished", 3, 3, 20.0)
    assert err.count("\n") == 1 and "progress-s0of1.json: a damaged progress record (started_at is 'yesterday'" in err


def test_planned_tokens_must_be_positive(tmp_path):
    out = _generate_dir(tmp_path / "gen", [10])
    for value in ("-5", "0"):
        code, view, err = run_status(out, "--planned-tokens", value)
        assert view is None and "--planned-tokens" in _one_line(code, err)


def test_lengths_are_counted_as_the_cap_counts_them(tmp_path):
    """Rows stopped at a 512 cap showed a median of 517 (issue 32 item 7)."""
    out = _generate_dir(tmp_path / "gen", [512] * 6 + [200] * 4)
    _, view, _ = run_status(out)
    lengths = view["lengths"]
    assert (lengths["max_tokens"], lengths["p50"], lengths["p90"], lengths["length_share"]) == (512, 512, 512, 0.6)
