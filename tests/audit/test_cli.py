from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from draftsmith.cli import main

from .conftest import write_jsonl
from .test_conversations import generated_rows


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["audit", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_clean_data_exits_zero_with_pass_line(capsys, clean_dir, tiny_target_dir):
    code, out, _ = run(capsys, clean_dir, "--tokenizer", tiny_target_dir)
    assert code == 0
    assert out.strip().splitlines()[-1].startswith("PASS: 300 tokenized samples audited")


def test_boilerplate_exits_one_naming_the_gates(capsys, boilerplate_dir, tiny_target_dir):
    code, out, _ = run(capsys, boilerplate_dir, "--tokenizer", tiny_target_dir)
    assert code == 1
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("FAIL (")
    assert "dominant_mask_sum" in verdict and "dominant_span" in verdict
    assert "87.0% of samples train on the very same completion 'Okay.<|im_end|>' (6 tokens)" in " ".join(out.split())


def test_json_output_and_plot(capsys, boilerplate_dir, tmp_path):
    plot = tmp_path / "plots" / "hist.png"
    code, out, err = run(capsys, boilerplate_dir, "--json", "--plot", plot)
    assert code == 1
    data = json.loads(out)
    assert data["kind"] == "draftsmith.audit" and data["passed"] is False
    assert data["dominant"]["mask_sum"]["value"] == 6
    assert abs(data["dominant"]["mask_sum"]["share"] - 0.87) < 1e-9
    assert data["verdict"] == err.strip().splitlines()[-1]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 10_000


def test_thresholds_and_kind_flags(capsys, boilerplate_dir, tmp_path):
    code, out, _ = run(
        capsys,
        boilerplate_dir,
        "--threshold", "dominant_mask_sum=none",
        "--threshold", "dominant-span=90%",
        "--threshold", "duplicate_completions=off",
        "--kind", "tokenized",
    )
    assert code == 0, out
    code, _, err = run(capsys, boilerplate_dir, "--threshold", "dominant_span=2")
    assert code == 2 and "between 0 and 1" in err
    code, _, err = run(capsys, boilerplate_dir, "--threshold", "bogus=0.1")
    assert code == 2 and "unknown threshold 'bogus'" in err


def test_thresholds_in_one_comma_separated_flag_as_help_lists_them(capsys, boilerplate_dir):
    code, out, _ = run(capsys, boilerplate_dir, "--threshold", "dominant_mask_sum=none,dominant-span=90%,duplicate_completions=off",
                       "--kind", "tokenized")
    assert code == 0, out
    code, _, err = run(capsys, boilerplate_dir, "--threshold", "dominant_mask_sum=none,dominant_span=2")
    assert code == 2 and "dominant_span" in err and "between 0 and 1" in err


def test_conversations_are_detected(capsys, tmp_path):
    good = write_jsonl(generated_rows(100), tmp_path / "good.jsonl")
    code, out, _ = run(capsys, good, "--json")
    assert code == 0 and json.loads(out)["input_kind"] == "conversations"
    bad = write_jsonl(generated_rows(100, boilerplate_share=0.87), tmp_path / "bad.jsonl")
    code, out, _ = run(capsys, bad)
    assert code == 1 and "FAIL" in out.strip().splitlines()[-1]


def test_unusable_input_exits_two(capsys, tmp_path):
    code, _, err = run(capsys, tmp_path / "missing.parquet")
    assert code == 2 and "missing.parquet: no such file or directory" in err
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = run(capsys, tmp_path / "notes.txt", "--kind", "tokenized")
    assert code == 2 and "notes.txt: unknown input format (expected .parquet, .arrow" in err


def test_console_script_in_a_subprocess(boilerplate_dir):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    result = subprocess.run(
        [sys.executable, "-m", "draftsmith", "audit", str(boilerplate_dir)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1].startswith("FAIL")
