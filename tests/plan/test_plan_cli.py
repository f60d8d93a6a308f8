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
                     "Days to finish", "GPU scaling", "Deadline", "GPUs", "Hidden states", "online"):
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
