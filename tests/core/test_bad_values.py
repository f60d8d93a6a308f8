"""The one number rule, strict JSON, URLs, config files and a full disk, through the real CLI.

Every case exits 2 with one `draftsmith: error: ...` line naming the value and the problem, never a
traceback, and never shows a password.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.core.io import DiskFullError, dumps_json, write_json_atomic
from draftsmith.core.manifest import check_manifest
from draftsmith.serve.process import ServeProcess

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}
DEAD = "http://127.0.0.1:9"


def one_line(code: int, err: str) -> str:
    assert "Traceback" not in err, err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("draftsmith: error: "), err
    return lines[0]


def cli(capsys, *args: str) -> str:
    code = main(list(args))
    return one_line(code, capsys.readouterr().err)


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                            for i in range(8)))
    return path


@pytest.mark.parametrize("value,problem", [
    ("nan", "--temperature: must be a finite number (got nan)"),
    ("inf", "--temperature: must be a finite number (got inf)"),
    ("-0.5", "--temperature: a temperature must be >= 0 (got -0.5)"),
])
def test_non_finite_and_negative_temperatures_are_refused(capsys, tmp_path, prompts, value, problem):
    out = tmp_path / "out"
    assert cli(capsys, "generate", str(prompts), "-o", str(out), "-e", DEAD, "--temperature", value) == f"draftsmith: error: {problem}"
    assert not out.exists()  # refused before the run made anything
    line = cli(capsys, "bench", str(prompts), "-o", str(tmp_path / "b.json"), "-e", DEAD, "--temperature", value)
    assert problem.split(":")[0] in line


@pytest.mark.parametrize("text,problem", [
    ("max_tokens: true\n", "max-tokens: expected a number, got a boolean (true)"),
    ('{"max_tokens": false}', "max-tokens: expected a number, got a boolean (false)"),
    ("temperature: .nan\n", "temperature: must be a finite number (got nan)"),
    ("temperature: .inf\n", "temperature: must be a finite number (got inf)"),
    ("top_p = nan\n", "top-p: must be a finite number (got nan)"),
    ("concurrency: {a: 1}\n", "concurrency"),
    ("max_tokens: [1, 2]\n", "max-tokens"),
])
def test_config_file_numbers_and_wrong_types_are_refused(capsys, tmp_path, prompts, text, problem):
    suffix = ".json" if text.startswith("{") else ".toml" if " = " in text else ".yaml"
    config = tmp_path / f"settings{suffix}"
    config.write_text(text)
    line = cli(capsys, "generate", str(prompts), "-o", str(tmp_path / "out"), "-e", DEAD, "--config", str(config))
    assert line.startswith(f"draftsmith: error: {config}: ") and problem in line


def test_a_boolean_is_not_a_number_in_the_python_api_either():
    from draftsmith.core.config import validate_config
    from draftsmith.train.config import ExtractConfig

    with pytest.raises(InputError, match="--batch-size: expected a number, got a boolean"):
        validate_config(ExtractConfig, {"target": "t", "data": "d", "out": "o", "batch_size": True})


def test_a_nan_setting_never_reaches_a_manifest(tmp_path):
    with pytest.raises(InputError, match=r"^sampling.temperature: must be a finite number \(got nan\)$"):
        check_manifest(tmp_path, "generate", {"sampling": {"temperature": float("nan")}})
    assert not (tmp_path / "manifest.json").exists()


def test_json_is_written_strictly(tmp_path):
    path = write_json_atomic(tmp_path / "r.json", {"tau": float("nan"), "rates": [1.5, float("inf")], "n": 3})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"tau": None, "rates": [1.5, None], "n": 3}
    assert dumps_json({"x": -math.inf}, indent=None) == '{"x": null}'


def test_invalid_utf8_in_a_config_file_is_one_line(capsys, tmp_path, prompts):
    config = tmp_path / "settings.yaml"
    config.write_bytes(b"concurrency: 2\nmodel: caf\xe9\n")
    line = cli(capsys, "generate", str(prompts), "-o", str(tmp_path / "out"), "-e", DEAD, "--config", str(config))
    assert line == f"draftsmith: error: {config}:2: not valid UTF-8 (byte 0xe9); save the file as UTF-8"


@pytest.mark.parametrize("url,problem", [
    ("http://user:secretpw@127.0.0.1:9", "http://user:***@127.0.0.1:9: the URL carries credentials and an API key is set too"),
    ("http://user:secretpw@127.0.0.1:notaport", "http://user:***@127.0.0.1:notaport: not a valid URL"),
    ("http://user:secretpw@[::1", "http://user:***@[::1: not a valid URL (Invalid IPv6 URL)"),
    ("http://127.0.0.1:99999", "http://127.0.0.1:99999: not a valid URL (Port out of range 0-65535)"),
    ("ftp://host", "ftp://host: not an http:// or https:// URL"),
    ("http://user:secretpw@", "http://user:***@: no host in the URL"),
])
def test_bad_endpoint_urls_are_one_line_without_the_password(tmp_path, prompts, url, problem):
    for args in (["generate", str(prompts), "-o", str(tmp_path / "out"), "--no-progress"],
                 ["bench", str(prompts), "-o", str(tmp_path / "b.json")]):
        result = subprocess.run([sys.executable, "-m", "draftsmith", *args, "-e", url, "--api-key", "KEY"],
                                env=ENV, capture_output=True, text=True, timeout=120)
        line = one_line(result.returncode, result.stderr)
        assert "secretpw" not in result.stderr
        assert problem in line


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 64 KiB tmpfs, filled up (root); elsewhere a write that fails with ENOSPC."""
    mount = tmp_path / "full"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode == 0
    if mounted:
        handle = open(mount / "filler", "wb")
        try:
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
        except OSError:
            pass
        try:
            handle.close()
        except OSError:
            pass
    yield mount, mounted
    if mounted:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_one_line_that_says_so(tmp_path, prompts, full_disk, monkeypatch):
    mount, mounted = full_disk
    if not mounted:  # no root: the write itself fails as a full disk makes it fail
        import errno

        import draftsmith.core.io as io

        def no_space(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(io, "fsync_tree", no_space)
        with pytest.raises(DiskFullError, match="the disk is full"):
            write_json_atomic(mount / "bench.json", {"a": 1})
        return
    with pytest.raises(DiskFullError, match=f"^{mount / 'x.json'}: the disk is full"):
        write_json_atomic(mount / "x.json", {"a": "b" * 100_000})
    assert not list(mount.glob(".x.json*"))  # no temporary left behind
    with ServeProcess(["--backend", "echo"]) as server:
        # bench writes through core.io; generate appends its shards itself: both say the disk is full
        for args in (["bench", str(prompts), "-o", str(mount / "bench.json"), "-e", server.url, "--concurrency", "1",
                      "--requests", "2", "--max-tokens", "8"],
                     ["generate", str(prompts), "-o", str(mount / "gen"), "-e", server.url, "--no-progress"]):
            result = subprocess.run([sys.executable, "-m", "draftsmith", *args], env=ENV, capture_output=True, text=True,
                                    timeout=180)
            assert "Traceback" not in result.stderr, result.stderr
            assert result.returncode == 2, result.stderr
            assert "the disk is full (no space left on device)" in result.stderr.strip().splitlines()[-1]
