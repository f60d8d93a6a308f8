import json

import pytest

from draftsmith.core.errors import InputError
from draftsmith.plan import build_inputs, load_config_file, make_plan


def test_yaml_file_with_relative_paths(tmp_path):
    (tmp_path / "pilot.txt").write_text("2000\n3000\n")
    (tmp_path / "plan.yaml").write_text(
        "samples: 914,000\n"
        "output-lengths: pilot.txt\n"
        "per_gpu: 400 tok/s\n"
        "gpus: 4\n"
        "claimed-rate: 5.76M/hour\n"
        "deadline: 7d\n"
        "disk: 90TB\n"
        "hidden-size: 5120\n"
    )
    inputs = build_inputs(tmp_path / "plan.yaml")
    assert inputs.samples == 914_000
    assert inputs.output_lengths == [2000, 3000]
    assert inputs.output_lengths_source == str(tmp_path / "pilot.txt")
    assert inputs.claimed_rates == ["5.76M/hour"]
    assert inputs.disk == 90 * 10**12
    plan = make_plan(inputs)
    assert plan.wall_time.days == pytest.approx(16.53, abs=0.01)


def test_toml_file_and_flag_overrides(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text('[plan]\nsamples = 914000\noutput-mean = 2500\nthroughput = "1,600 tok/s"\n')
    assert make_plan(build_inputs(path)).wall_time.days == pytest.approx(16.53, abs=0.01)
    overridden = build_inputs(path, {"throughput": "1,500 tok/s", "gpus": None})
    assert overridden.throughput == "1,500 tok/s" and overridden.gpus is None
    # A flag giving the length as a distribution replaces the file's average.
    (tmp_path / "lengths.txt").write_text("10\n20\n")
    with_lengths = build_inputs(path, {"output_lengths": str(tmp_path / "lengths.txt")})
    assert with_lengths.output_mean is None and with_lengths.output_lengths == [10, 20]


def test_config_errors(tmp_path):
    unknown = tmp_path / "plan.yaml"
    unknown.write_text("samples: 5\nsample-count: 6\n")
    with pytest.raises(InputError, match=r"plan.yaml: unknown key 'sample-count'"):
        load_config_file(unknown)
    broken = tmp_path / "broken.toml"
    broken.write_text("samples = = 5\n")
    with pytest.raises(InputError, match=r"broken.toml: cannot parse"):
        load_config_file(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match="expected a mapping"):
        load_config_file(listing)
    with pytest.raises(InputError, match="no such config file"):
        load_config_file(tmp_path / "missing.yaml")
    with pytest.raises(InputError, match="unknown config format"):
        other = tmp_path / "plan.ini"
        other.write_text("x")
        load_config_file(other)


def test_json_config_is_read_as_yaml(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"samples": 10, "output_mean": 10, "throughput": "1 tok/s"}))
    assert make_plan(build_inputs(path)).wall_time.seconds == 100
