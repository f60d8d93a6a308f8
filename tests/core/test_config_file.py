"""`--config FILE` guards: alias bombs refused quickly, SIGTERM honoured while parsing, `${VAR}` expanded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftsmith.core.config import build_config, read_config_file
from draftsmith.core.config_file import MAX_EXPANDED_NODES
from draftsmith.core.errors import InputError

SOURCE = str(Path(__file__).resolve().parents[2] / "src")


def alias_bomb(levels: int = 9) -> str:
    """10**levels values from a few hundred bytes, under a key that takes any JSON (bench extra-body)."""
    lines = ["extra-body:", "  x:", "  - &a [1,1,1,1,1,1,1,1,1,1]"]
    names = "abcdefghijklmnop"
    for previous, name in zip(names, names[1:levels]):
        lines.append(f"  - &{name} [" + ",".join([f"*{previous}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def draftsmith(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SOURCE, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "draftsmith", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_yaml_alias_bomb_is_refused_in_one_line_quickly(tmp_path):
    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    (tmp_path / "prompts.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    started = time.monotonic()
    process = draftsmith(["bench", "prompts.jsonl", "--config", "bomb.yaml", "--endpoint", "http://127.0.0.1:9"], tmp_path)
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 2, stderr
    assert "bomb.yaml" in stderr and "aliases" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert time.monotonic() - started < 30


def test_aliases_within_the_limit_still_load(tmp_path):
    path = tmp_path / "shared.yaml"
    path.write_text("a: &values [1, 2, 3]\nb: *values\n")
    assert read_config_file(path) == {"a": [1, 2, 3], "b": [1, 2, 3]}
    path.write_text(alias_bomb(levels=6))  # 10**6 values plus their lists: just past the limit
    with pytest.raises(InputError, match="aliases expand to more than"):
        read_config_file(path)
    assert MAX_EXPANDED_NODES < 10**6 + 10**5


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_sigterm_stops_a_slow_parse(tmp_path):
    """A large (legal-size) YAML file takes seconds to parse: SIGTERM still stops it, exit 143."""
    rows = "".join(f"  - {{id: row{index}, text: 'value {index}', weight: {index}}}\n" for index in range(120_000))
    (tmp_path / "big.yaml").write_text("extra-body:\n  rows:\n" + rows)
    (tmp_path / "prompts.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    process = draftsmith(["bench", "prompts.jsonl", "--config", "big.yaml", "--endpoint", "http://127.0.0.1:9"], tmp_path)
    try:
        # Under way once the process has spent more CPU than starting the CLI takes (about 2 s; the
        # parse about 70 s): counted in CPU seconds, not wall seconds, so a loaded machine waits longer.
        deadline = time.monotonic() + 120
        while _cpu_seconds(process.pid) < 6:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the parse never started"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr


def test_environment_variables_are_expanded_or_refused_naming_them(tmp_path, monkeypatch):
    from draftsmith.bench.config import BenchConfig

    path = tmp_path / "bench.yaml"
    path.write_text("endpoint: http://${DRAFTSMITH_TEST_HOST}:8000\nextra-body: {note: 'costs $${NOT_A_VAR}'}\n")
    monkeypatch.setenv("DRAFTSMITH_TEST_HOST", "10.1.2.3")
    config = build_config(BenchConfig, {"prompts": [tmp_path / "p.jsonl"]}, path)
    assert config.endpoint == "http://10.1.2.3:8000"
    assert config.extra_body == {"note": "costs ${NOT_A_VAR}"}
    monkeypatch.delenv("DRAFTSMITH_TEST_HOST")
    with pytest.raises(InputError) as error:
        build_config(BenchConfig, {"prompts": [tmp_path / "p.jsonl"]}, path)
    message = str(error.value)
    assert "bench.yaml" in message and "endpoint" in message and "DRAFTSMITH_TEST_HOST is not set" in message


def test_a_lone_surrogate_in_a_config_value_is_one_line(tmp_path):
    """Found by test_config_fuzz: JSON may escape half a UTF-16 pair; it used to reach validation as a UnicodeEncodeError."""
    from draftsmith.evaluate.config import EvalConfig

    path = tmp_path / "eval.json"
    path.write_text('{"prompts": "\\ud800"}')
    with pytest.raises(InputError, match=r"eval.json: prompts: not valid text"):
        build_config(EvalConfig, {}, path)


def test_a_lone_surrogate_under_a_key_with_a_newline_is_one_line(tmp_path):
    # Found by the fuzz test: YAML reads JSON's escapes into a lone surrogate under a key named "\n".
    path = tmp_path / "config.yaml"
    path.write_text('{"batch-size": {"\\n": "\\ud800"}}')
    with pytest.raises(InputError) as raised:
        read_config_file(path)
    assert "\n" not in str(raised.value) and "'batch-size.\\n'" in str(raised.value), str(raised.value)
