"""`plan device --measure`: this machine timed as a catalogue entry that `--gpu FILE` takes in every
plan, and a file that is no device entry refused in one line (exit 2)."""

from __future__ import annotations

import json

import pytest

from draftsmith.cli import main
from draftsmith.plan.device import device_dict, load_device, measure_device, parse_seconds
from draftsmith.plan.gpus import GpuSpec, find_gpu
from tests.plan.test_plan_speculation import qwen3


def test_measured_figures_are_plausible_for_this_machine():
    device = measure_device("cpu", name="here", copy_bytes=32 * 2**20, matmul_size=256, threads=1)
    assert isinstance(device, GpuSpec)
    # A CPU core copies at 1-100 GB/s and multiplies fp32 at 1-1000 GFLOP/s; memory is the machine's RAM.
    assert 1e9 < device.bandwidth_bytes_per_s < 1e12
    assert 1e9 < device.fp32_flops < 1e13 and device.bf16_flops > 1e8
    assert device.memory_bytes > 2**30 and device.step_overhead_s == 0
    assert device.name == "here" and "(measured)" in device.title


def test_the_cli_writes_an_entry_every_plan_takes(tmp_path, capsys):
    out = tmp_path / "here.json"
    assert main(["plan", "device", "--measure", "--out", str(out), "--step-overhead", "1.5ms", "--threads", "1",
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["kind"] == "draftsmith.plan.device" and printed["step_overhead_s"] == pytest.approx(0.0015)
    device = find_gpu(str(out))
    assert device.bandwidth_bytes_per_s == printed["bandwidth_bytes_per_s"]

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(qwen3()))
    assert main(["plan", "engine", "--model-config", str(target), "--gpu", str(out), "--output-mean", "100",
                 "--concurrency", "1", "--json"]) == 0
    engine = json.loads(capsys.readouterr().out)
    assert engine["gpu"] == printed["title"]
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(qwen3(
        architectures=["DFlashDraftModel"], num_hidden_layers=1, block_size=4,
        dflash_config={"mask_token_id": 3, "target_layer_ids": [1]})))
    assert main(["plan", "speculation", "--model-config", str(target), "--drafter", str(drafter), "--gpu", str(out),
                 "--weights", "fp32", "--acceptance", "0.5,0.3,0.1", "--output-mean", "100", "--concurrency", "1",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["step_overhead_s"] == pytest.approx(0.0015)
    entry = plan["plans"][0]["no_speculation"]
    assert entry["step_time_s"] == pytest.approx(entry["target_step_s"] + 0.0015)


def test_fp32_is_twice_the_bytes_at_the_fp32_matmul_rate(tmp_path):
    device = find_gpu("l40s").model_copy(update={"fp32_flops": 90e12, "name": "l40s-measured"})
    path = tmp_path / "l40s.json"
    path.write_text(json.dumps(device_dict(device)))
    assert load_device(path) == device
    from draftsmith.plan.speculation import _device_view

    view, weights = _device_view(load_device(path), "fp32")
    assert weights == "bf16" and view.bandwidth_bytes_per_s == device.bandwidth_bytes_per_s / 2
    assert view.peak_flops("bf16") == 90e12 and view.memory_bytes == device.memory_bytes // 2


@pytest.mark.parametrize("content, message", [
    ("not json", "not a device file"),
    (json.dumps([1, 2]), "not a device file (field 'kind' is 'list'"),
    (json.dumps({"kind": "draftsmith.plan.device", "version": 7}), "unsupported device file version 7"),
    (json.dumps({"kind": "draftsmith.plan.device", "version": 1, "name": "x", "title": "x", "memory_bytes": 1,
                 "bf16_flops": 1.0}), "field 'bandwidth_bytes_per_s': Field required"),
    (json.dumps({"kind": "draftsmith.plan.device", "version": 1, "name": "x", "title": "x", "memory_bytes": 1,
                 "bandwidth_bytes_per_s": -5.0, "bf16_flops": 1.0}), "field 'bandwidth_bytes_per_s' must be positive"),
])
def test_a_file_that_is_no_device_exits_2(tmp_path, capsys, content, message):
    path = tmp_path / "device.json"
    path.write_text(content)
    assert main(["plan", "engine", "--params", "1B", "--kv-bytes-per-token", "1000", "--gpu", str(path),
                 "--output-mean", "100"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err, err
    assert err.count("\n") == 1


def test_step_overhead_needs_its_unit():
    assert parse_seconds("250us", "--step-overhead") == pytest.approx(250e-6)
    assert parse_seconds("0.002s", "--step-overhead") == pytest.approx(0.002)
    with pytest.raises(Exception, match="expected a duration with its unit"):
        parse_seconds("2", "--step-overhead")
