"""In-process eval: the greedy check's near-tie tolerance (both sides of it), --device and --dtype,
--temperature end to end through the CLI, and an unreadable target as one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import draftsmith.evaluate.speculative as speculative
from draftsmith.cli import main
from draftsmith.evaluate import LosslessnessError, evaluate_drafter
from draftsmith.model import DFlashDraftModel, build_drafter_config, save_drafter
from draftsmith.model.speculative import greedy_decode
from draftsmith.tiny import synthetic_prompts

SRC = str(Path(__file__).resolve().parents[2] / "src")
NEW_TOKENS = 12
FLIP_AT = 2


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(0)
    config = build_drafter_config(target.config, num_draft_layers=1, block_size=4, mask_token_id=3)
    return DFlashDraftModel(config).eval()


@pytest.fixture(scope="module")
def drafter_dir(drafter, tmp_path_factory):
    return save_drafter(drafter, tmp_path_factory.mktemp("drafter") / "drafter")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(2, seed=11)))
    return path


def _planted(monkeypatch, flip, later_wrong: int | None = None):
    """speculative_decode whose output parts from greedy at FLIP_AT with `flip(reference)`, then goes
    on as the target's own greedy continuation of that prefix (optionally wrong again at `later_wrong`)."""
    real = speculative.speculative_decode

    def planted(target, drafter, input_ids, max_new_tokens, stops, *args, **kwargs):
        result = real(target, drafter, input_ids, max_new_tokens, stops, *args, **kwargs)
        if max_new_tokens <= FLIP_AT + 1:
            return result
        reference = greedy_decode(target, input_ids, max_new_tokens, stops)
        prefix = reference.tokens[:FLIP_AT] + [flip(reference)]
        rest = greedy_decode(target, torch.cat([input_ids, torch.tensor([prefix])], 1), max_new_tokens - len(prefix), stops)
        result.tokens = prefix + ([] if prefix[-1] in stops else rest.tokens)
        if later_wrong is not None:
            # The runner-up's continuation may stop early: plant on its last token, still after the tie.
            index = min(later_wrong, len(result.tokens) - 1)
            assert index > FLIP_AT, "the planted continuation must go past the near-tie"
            result.tokens[index] = (result.tokens[index] + 1) % target.config.vocab_size
        return result

    monkeypatch.setattr(speculative, "speculative_decode", planted)


def _runner_up(reference):
    return reference.runners_up[FLIP_AT]


def test_a_near_tie_within_the_tolerance_is_reported_not_failed(monkeypatch, target, drafter, prompts_file,
                                                                 tiny_tokenizer):
    margins = [greedy_decode(target, ids, NEW_TOKENS, [tiny_tokenizer.eos_token_id]).margins[FLIP_AT]
               for ids in _encoded(prompts_file, tiny_tokenizer)]
    _planted(monkeypatch, _runner_up)
    tolerance = max(margins) + 1e-3
    report = evaluate_drafter(target, drafter, prompts_file, max_new_tokens=NEW_TOKENS, tokenizer=tiny_tokenizer,
                              tie_tolerance=tolerance)
    assert report.lossless is True and report.mismatched_prompts == []
    assert report.near_ties == 2 and len(report.near_tie_prompts) == 2 and report.tie_tolerance == tolerance
    assert all(r.near_ties == [FLIP_AT] and r.identical for r in report.per_prompt)
    data = json.loads(report.to_json())
    assert data["near_ties"] == 2 and data["per_prompt"][0]["near_ties"] == [FLIP_AT]
    assert "2 near-ties within" in report.verdict
    # The same flip with a margin above the tolerance is a real difference.
    with pytest.raises(LosslessnessError, match=f"first difference at new token {FLIP_AT}"):
        evaluate_drafter(target, drafter, prompts_file, max_new_tokens=NEW_TOKENS, tokenizer=tiny_tokenizer,
                         tie_tolerance=min(margins) / 2)


def test_a_real_divergence_fails_whatever_the_tolerance(monkeypatch, target, drafter, prompts_file, tiny_tokenizer):
    # Neither the target's choice nor its runner-up: no floating-point flip gives this token.
    def third(reference):
        token, runner = reference.tokens[FLIP_AT], reference.runners_up[FLIP_AT]
        return next(t for t in range(3, 100) if t not in (token, runner))

    _planted(monkeypatch, third)
    report = evaluate_drafter(target, drafter, prompts_file, max_new_tokens=NEW_TOKENS, tokenizer=tiny_tokenizer,
                              tie_tolerance=1e9, strict=False)
    assert report.lossless is False and len(report.mismatched_prompts) == 2 and report.near_ties == 0
    assert all(r.first_mismatch == FLIP_AT for r in report.per_prompt)


def test_after_a_near_tie_the_rest_is_still_checked(monkeypatch, target, drafter, prompts_file, tiny_tokenizer):
    _planted(monkeypatch, _runner_up, later_wrong=FLIP_AT + 4)
    report = evaluate_drafter(target, drafter, prompts_file, max_new_tokens=NEW_TOKENS, tokenizer=tiny_tokenizer,
                              tie_tolerance=1e9, strict=False, limit=1)
    assert report.lossless is False
    assert report.per_prompt[0].first_mismatch == FLIP_AT + 4 and report.per_prompt[0].near_ties == [FLIP_AT]


def _encoded(prompts_file, tokenizer):
    from draftsmith.evaluate import read_prompts

    out = []
    for prompt in read_prompts(prompts_file):
        text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
        out.append(torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]]))
    return out


def _eval_args(tiny_target_dir, drafter_dir, prompts_file, *extra):
    return ["eval", "--target", str(tiny_target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts_file),
            "--max-new-tokens", "12", "--limit", "2", "--json", *extra]


def test_cli_eval_device_and_dtype(tiny_target_dir, drafter_dir, prompts_file, capsys):
    assert main(_eval_args(tiny_target_dir, drafter_dir, prompts_file, "--device", "cpu", "--dtype", "bf16")) == 0
    data = json.loads(capsys.readouterr().out)
    # The target loaded in bf16 and the float32 drafter checkpoint ran beside it in bf16.
    assert data["device"] == "cpu" and data["dtype"] == "bfloat16" and data["tie_tolerance"] == 0.5
    assert data["lossless"] is True and data["num_prompts"] == 2
    assert main(_eval_args(tiny_target_dir, drafter_dir, prompts_file, "--tie-tolerance", "0")) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["dtype"] == "float32" and data["tie_tolerance"] == 0 and data["near_ties"] == 0
    # Without --threads the count chosen from the machine's load is said once, when decoding starts.
    assert captured.err.count("draftsmith eval: threads: ") == 1 and "one per idle CPU" in captured.err, captured.err
    for device, message in (("tpu", "--device must be auto, cpu, cuda"), ("cuda:0", "sees no cuda device")):
        if device.startswith("cuda") and torch.cuda.is_available():
            continue
        assert main(_eval_args(tiny_target_dir, drafter_dir, prompts_file, "--device", device)) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_cli_eval_temperature_end_to_end(tiny_target_dir, drafter_dir, prompts_file, tmp_path, capsys):
    runs = []
    for seed in ("3", "3"):
        out = tmp_path / f"report-{len(runs)}.json"
        args = _eval_args(tiny_target_dir, drafter_dir, prompts_file, "--temperature", "1.2", "--seed", seed,
                          "--out", str(out))
        assert main(args) == 0
        printed = json.loads(capsys.readouterr().out)
        assert json.loads(out.read_text()) == printed
        runs.append(printed)
    sampled = runs[0]
    assert sampled["temperature"] == 1.2 and sampled["lossless"] is None and sampled["tie_tolerance"] is None
    assert sampled["num_prompts"] == 2 and sampled["total_cycles"] > 0 and 1.0 <= sampled["tau"] <= 4
    # The same seed samples the same tokens: the same cycles and acceptance.
    strip = ("speculative_seconds", "target_seconds")
    assert [{k: v for k, v in r.items() if k not in strip} for r in runs[1]["per_prompt"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in sampled["per_prompt"]]
    assert runs[1]["acceptance_histogram"] == sampled["acceptance_histogram"]
    assert main(_eval_args(tiny_target_dir, drafter_dir, prompts_file, "--temperature", "-1")) == 2
    assert "--temperature" in capsys.readouterr().err


DAMAGES = {
    # file damaged -> (new bytes from the old ones, what the one line must say after the path)
    "truncated weights": ("model.safetensors", lambda data: data[: len(data) // 2], "not a readable safetensors file"),
    "garbage weights": ("model.safetensors", lambda data: b"\x07" * 64, "not a readable safetensors file"),
    "bad config.json": ("config.json", lambda data: b'{"architectures": [', "invalid JSON"),
    "bad generation_config.json": ("generation_config.json", lambda data: b"not json", "invalid JSON"),
}


def _damaged_target(tiny_target_dir, tmp_path, damage: str):
    name, rewrite, message = DAMAGES[damage]
    broken = tmp_path / "target"
    shutil.copytree(tiny_target_dir, broken)
    file = broken / name
    file.write_bytes(rewrite(file.read_bytes()))
    return file, message


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_cli_eval_on_a_broken_target_is_one_line_naming_the_file(tiny_target_dir, drafter_dir, prompts_file, tmp_path,
                                                                 capsys, damage):
    # eval loads the target through model.target's loader: before, a bad config.json was
    # transformers' traceback (exit 1) and a bad generation_config.json was ignored (exit 0).
    file, message = _damaged_target(tiny_target_dir, tmp_path, damage)
    assert main(_eval_args(file.parent, drafter_dir, prompts_file)) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftsmith: error:") and err.count("\n") == 1, err
    assert f"{file}" in err and message in err and "Traceback" not in err


@pytest.mark.parametrize("damage", ["bad config.json", "bad generation_config.json"])
def test_eval_and_serve_processes_on_a_bad_config_exit_2_with_one_line(tiny_target_dir, drafter_dir, prompts_file,
                                                                        tmp_path, damage):
    file, message = _damaged_target(tiny_target_dir, tmp_path, damage)
    env = dict(os.environ, PYTHONPATH=SRC)
    commands = {
        "eval": ["eval", "--target", str(file.parent), "--drafter", str(drafter_dir), "--prompts", str(prompts_file),
                 "--max-new-tokens", "4"],
        "serve": ["serve", "--backend", "model", "--model", str(file.parent), "--port", "0"],
    }  # fmt: skip
    for stage, args in commands.items():
        result = subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True, env=env,
                                timeout=240)  # fmt: skip
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, (stage, result.stderr)
        assert lines[0].startswith(f"draftsmith: error: {file}") and message in lines[0], (stage, lines[0])
