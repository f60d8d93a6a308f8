import json
import os
import subprocess
import sys
from pathlib import Path

from draftsmith.cli import main

STORY = ["plan", "--samples", "914000", "--output-mean", "2500"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_json_output_of_the_known_case(capsys):
    assert main(STORY + ["--throughput", "1,600 tok/s", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "draftsmith.plan"
    assert data["total_output_tokens"] == 2_285_000_000
    assert round(data["wall_time"]["days"], 1) == 16.5


def test_tables_show_the_plan(capsys, tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(["1000"] * 9 + ["9000"]) + "\n")
    code = main(
        ["plan", "--samples", "914k", "--output-lengths", str(lengths), "--max-tokens", "8192",
         "--per-gpu", "400 tok/s", "--gpus", "4", "--efficiency", "0.9", "--deadline", "7d",
         "--hidden-size", "5120", "--prompt-mean", "500", "--claimed-rate", "129.6M/day"]
    )
    out = capsys.readouterr().out
    assert code == 0
    for expected in ("Regeneration plan", "Rate cross-check", "p99", "hit max_tokens=8,192", "longest 10%",
                     "Days to finish", "GPU scaling", "Deadline", "GPUs", "Hidden states", "online",
                     "suggested --max-tokens"):
        assert expected in out, expected


def test_unit_slip_exits_2_with_one_line(capsys):
    code = main(STORY + ["--throughput", "1,500 tok/s", "--claimed-rate", "5.4M/day"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("draftsmith: error: rates disagree")
    assert "5.4M/hour matches 1,500 tok/s" in err
    assert err.count("\n") == 1
    assert main(STORY + ["--throughput", "1,500 tok/s", "--claimed-rate", "5.4M/day", "--use-rate", "throughput",
                         "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert round(data["wall_time"]["days"], 1) == 17.6
    assert data["rate_checks"][0]["matching_reading"]["text"] == "5.4M/hour"


def test_bad_inputs_exit_2(capsys, tmp_path):
    cases = [
        (["plan", "--samples", "-5", "--output-mean", "2500", "--throughput", "1 tok/s"], "--samples"),
        (STORY + ["--throughput", "1,600 tok/fortnight"], "unknown time unit 'fortnight'"),
        (STORY + ["--throughput", "1,5k tok/s"], "'1,5' is ambiguous: a comma may be a decimal point"),
        (STORY, "no throughput given"),
        (["plan", "--output-mean", "2500", "--throughput", "1 tok/s"], "--samples is required"),
        (STORY + ["--throughput", "1 tok/s", "--disk", "9 parsecs"], "unknown size unit"),
        (STORY + ["--throughput", "1 tok/s", "--output-lengths", str(tmp_path / "none.parquet:x")], "no such file"),
        (STORY + ["--bench", str(tmp_path / "none.json")], "no such bench result"),
    ]
    for argv, fragment in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("draftsmith: error:") and fragment in err, (argv, err)
        assert err.count("\n") == 1, err


def test_console_script_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=SRC)
    ok = subprocess.run([sys.executable, "-m", "draftsmith", *STORY, "--throughput", "1,500 tok/s", "--json"],
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert round(json.loads(ok.stdout)["wall_time"]["days"], 1) == 17.6
    slip = subprocess.run([sys.executable, "-m", "draftsmith", *STORY, "--throughput", "1,500 tok/s",
                           "--claimed-rate", "5.4M/day"], capture_output=True, text=True, env=env, timeout=60)
    assert slip.returncode == 2
    assert "5.4M/hour matches 1,500 tok/s" in slip.stderr and "Traceback" not in slip.stderr


def test_plan_train_is_a_subcommand_and_plan_dash_train_its_deprecated_alias(tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1536,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000,
    }))
    args = ["--samples", "10k", "--mean-length", "2000", "--gpus", "2", "--model-config", str(target), "--json"]
    assert main(["plan", "train", *args]) == 0
    captured = capsys.readouterr()
    subcommand = json.loads(captured.out)
    assert subcommand["kind"] == "draftsmith.plan.train" and "deprecated" not in captured.err
    assert subcommand["inputs"]["samples"] == 10_000 and subcommand["inputs"]["gpus"] == 2
    assert main(["plan", "--train", *args]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == subcommand
    assert "`plan --train` is deprecated; use `draftsmith plan train`" in captured.err
    # The regeneration plan's own flags are not the training plan's, and the other way round.
    assert main(["plan", "train", *args, "--per-gpu", "400 tok/s"]) == 2
    assert "--per-gpu" in capsys.readouterr().err
    assert main([*STORY, "--throughput", "1 tok/s", "--epochs", "6"]) == 2
    assert "--epochs" in capsys.readouterr().err


def test_plan_help_lists_the_train_subcommand(capsys):
    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--samples" in out and "--output-mean" in out and "train" in out
    assert main(["plan", "train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--mean-length" in out and "--offline" in out and "--output-lengths" not in out


def test_one_plan_file_serves_both_plans(tmp_path, capsys):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1536,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000,
    }))
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("plan:\n  samples: 914k\n  output-mean: 2200\n  prompt-mean: 500\n  gpus: 4\n"
                         "  model-config: target/config.json\n")
    assert main(["plan", "train", "--config", str(plan_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["mean_length"] == 2700
    assert main(["plan", "--config", str(plan_file), "--per-gpu", "400 tok/s", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_output_tokens"] == 914_000 * 2200 and data["storage"]["hidden_size"] == 512
