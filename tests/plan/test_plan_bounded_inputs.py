"""The measurement and device files `plan speculation` reads, and its numbers, bounded: a FIFO, a link
to /dev/zero, JSON nested 100,000 deep, a profile of 2M positions, a scrape naming position
99999999, a device figure that is NaN, infinite or absurd, an output mean of 1e160: each one line
naming the flag (or file and field) and exit 2, in well under a second, never a hang or an
allocation of gigabytes."""

from __future__ import annotations

import json
import os
import time

import pytest

from draftsmith.cli import main
from draftsmith.client.prometheus import parse_samples, vllm_position_counts
from draftsmith.core.errors import InputError
from draftsmith.plan.device import device_dict
from draftsmith.plan.gpus import find_gpu
from draftsmith.plan.speculation import MAX_POSITIONS
from tests.plan.test_plan_speculation import models  # noqa: F401 (the fixture)

SCRAPE_HEAD = 'vllm:spec_decode_num_drafts_total{engine="0"} 100\n'


def _accepted(position: int | str, count: int = 50) -> str:
    return f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{position}"}} {count}\n'


def _write_cases(directory) -> dict[str, str]:
    """Each hostile acceptance file, by case name -> its path."""
    paths = {}
    fifo = directory / "fifo"
    os.mkfifo(fifo)
    paths["fifo"] = fifo
    zero = directory / "zero.txt"
    zero.symlink_to("/dev/zero")
    paths["link to /dev/zero"] = zero
    deep = directory / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    paths["JSON 100,000 deep"] = deep
    wide = directory / "wide.json"
    wide.write_text(json.dumps({"kind": "draftsmith.eval.endpoint", "per_position_acceptance": [0.0] * 2_000_000}))
    paths["2M positions (JSON)"] = wide
    far = directory / "far.txt"
    far.write_text(SCRAPE_HEAD + _accepted(0) + _accepted(99999999))
    paths['position="99999999"'] = far
    huge_label = directory / "huge-label.txt"
    huge_label.write_text(SCRAPE_HEAD + _accepted("9" * 5000))
    paths["a 5,000-digit position"] = huge_label
    many = directory / "many.txt"
    many.write_text(SCRAPE_HEAD + "".join(_accepted(k, 1) for k in range(300)))
    paths["300 positions (scrape)"] = many
    return {name: str(path) for name, path in paths.items()}


EXPECTED = {
    "fifo": "not a regular file (a FIFO)",
    "link to /dev/zero": "not a regular file (a character device)",
    "JSON 100,000 deep": "JSON nested 100,000 levels deep",
    "2M positions (JSON)": f"2,000,000 draft positions; no draft block has more than {MAX_POSITIONS}",
    'position="99999999"': "names position 99999999; no draft block has more than",
    "a 5,000-digit position": "names position 999999999999...; no draft block has more than",
    "300 positions (scrape)": "names position 255; no draft block has more than 255",
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_hostile_acceptance_file_is_one_line_and_fast(models, tmp_path, capsys, case):  # noqa: F811
    target, drafter = models
    path = _write_cases(tmp_path)[case]
    for flag in ("--acceptance-from", "--ngram-from"):
        argv = ["plan", "speculation", "--model-config", str(target), "--drafter", str(drafter), "--gpu", "h100",
                "--output-mean", "100", flag, path]
        if flag == "--ngram-from":
            argv += ["--acceptance", "0.5,0.3"]
        began = time.monotonic()
        assert main(argv) == 2
        assert time.monotonic() - began < 10  # a FIFO would hang, /dev/zero read forever, 2.7 GB take minutes
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"draftsmith: error: {flag} {path}"), err
        assert EXPECTED[case] in err, err


def test_positions_past_the_drafters_block_are_read_and_ignored_with_a_warning(models, tmp_path, capsys):  # noqa: F811
    target, drafter = models  # block 8: 7 positions
    scrape = tmp_path / "metrics.txt"
    scrape.write_text(SCRAPE_HEAD + "".join(_accepted(k, 90 - 10 * k) for k in range(9)))
    assert main(["plan", "speculation", "--model-config", str(target), "--drafter", str(drafter), "--gpu", "h100",
                 "--output-mean", "100", "--acceptance-from", str(scrape), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["acceptance"]["per_position"]) == 9
    assert any("positions past 7 are ignored" in warning for warning in plan["warnings"])


def test_position_counts_are_capped_only_where_asked():
    samples = parse_samples(SCRAPE_HEAD + _accepted(0) + _accepted(3))
    assert vllm_position_counts(samples).accepted_per_position == [50, 0, 0, 50]  # a live bench scrape: as is
    with pytest.raises(InputError, match="names position 3; no draft block has more than 3"):
        vllm_position_counts(samples, max_positions=3)


@pytest.mark.parametrize("value, message", [
    ("0.5,,0.2", "--acceptance '0.5,,0.2': position 2 is empty (two commas in a row?)"),
    ("0.5,0.2,", "--acceptance '0.5,0.2,': position 3 is empty"),
    (",".join(["0.1"] * 300), f"--acceptance: 300 positions; no draft block has more than {MAX_POSITIONS}"),
])
def test_an_acceptance_list_with_a_gap_is_refused_not_shifted(models, capsys, value, message):  # noqa: F811
    target, drafter = models
    assert main(["plan", "speculation", "--model-config", str(target), "--drafter", str(drafter), "--gpu", "h100",
                 "--output-mean", "100", "--acceptance", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("flag, value, message", [
    ("--output-mean", "1e160", "--output-mean '1e160' is longer than any model's context"),
    ("--output-mean", "nan", "--output-mean 'nan': expected a number"),
    ("--prompt-mean", "1e300", "--prompt-mean '1e300' is longer than any model's context"),
])
def test_plan_speculation_token_means_are_bounded_like_plan_engines(models, capsys, flag, value, message):  # noqa: F811
    target, drafter = models
    flags = {"--output-mean": "100", flag: value}
    argv = ["plan", "speculation", "--model-config", str(target), "--drafter", str(drafter), "--gpu", "h100",
            "--acceptance", "0.5,0.3", *[item for pair in flags.items() for item in pair]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("field, value, message", [
    ("step_overhead_s", float("nan"), "'step_overhead_s' must be a finite number, got nan"),
    ("step_overhead_s", 1e300, "'step_overhead_s' is 1e+300, beyond any device (at most 6e+01)"),
    ("bandwidth_bytes_per_s", float("inf"), "'bandwidth_bytes_per_s' must be a finite number, got inf"),
    ("bf16_flops", 1e30, "'bf16_flops' is 1e+30, beyond any device"),
    ("memory_bytes", 10**20, "'memory_bytes' is 1e+20, beyond any device"),
    ("draft_token_overhead_s", -1.0, "'draft_token_overhead_s' must be 0 or more"),
])
def test_a_device_file_figure_that_is_not_finite_or_beyond_any_device_is_one_line(tmp_path, capsys, field, value,
                                                                                 message):  # fmt: skip
    entry = device_dict(find_gpu("h100"))
    entry[field] = value
    path = tmp_path / "device.json"
    path.write_text(json.dumps(entry))  # NaN and Infinity as Python's json writes them
    for argv in (["plan", "engine", "--params", "1B", "--kv-bytes-per-token", "1000", "--gpu", str(path),
                  "--output-mean", "100"],):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--gpu {path}: field {message}" in err, err


def test_a_device_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    fifo = tmp_path / "device.json"
    os.mkfifo(fifo)
    assert main(["plan", "engine", "--params", "1B", "--kv-bytes-per-token", "1000", "--gpu", str(fifo),
                 "--output-mean", "100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--gpu {fifo}: not a regular file (a FIFO)" in err, err


def test_plan_device_checks_out_before_measuring(tmp_path, capsys):
    began = time.monotonic()
    assert main(["plan", "device", "--measure", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"draftsmith: error: --out {tmp_path}: is a directory; --out names the file to write "
                   f"(e.g. {tmp_path / 'device.json'})\n")
    assert time.monotonic() - began < 5  # nothing was measured (a measurement takes seconds)
    in_the_way = tmp_path / "file"
    in_the_way.write_text("")
    assert main(["plan", "device", "--measure", "--out", str(in_the_way / "device.json")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
