"""A secret planted in endpoint URLs must not reach any file or stream that generate or bench write."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from draftsmith.serve.process import ServeProcess
from draftsmith.tiny import synthetic_prompts

SRC = Path(__file__).resolve().parents[1] / "src"
SECRET = "pl4ntedS3cret"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="300")
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True, env=env, timeout=180)


def test_credentials_in_endpoint_urls_are_redacted_everywhere(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(30, seed=5)))
    out = tmp_path / "out"
    with ServeProcess(["--fail-rate", "0.3", "--fail-status", "400", "--seed", "1"]) as server:
        live = server.url.replace("http://", f"http://alice:{SECRET}@")
        dead = f"http://bob:{SECRET}@127.0.0.1:{_closed_port()}"
        generated = _run(["generate", str(prompts), "-o", str(out), "-e", live, "-e", dead, "--no-progress",
                          "--json", "--endpoint-wait", "5", "--health-interval", "0.2"])
        bench = _run(["bench", str(prompts), "-e", live, "--concurrency", "1,2", "--requests", "4", "--no-warmup",
                      "-o", str(tmp_path / "bench.json")])
        unreachable = _run(["bench", str(prompts), "-e", dead, "-o", str(tmp_path / "none.json")])

    assert generated.returncode == 1, generated.stderr[-3000:]
    rows = [json.loads(line) for path in out.glob("generated-*.jsonl") for line in path.read_text().splitlines()]
    failures = [json.loads(line) for line in (out / "failures-s0of1.jsonl").read_text().splitlines()]
    assert rows and failures  # both files were written, with endpoints in them
    assert {row["endpoint"] for row in rows} == {server.url.replace("http://", "http://alice:***@")}
    assert failures[0]["endpoint"].startswith("http://alice:***@")
    assert "bob:***@" in generated.stderr  # the dead endpoint is reported, masked
    assert unreachable.returncode == 2 and "cannot reach http://bob:***@" in unreachable.stderr
    assert bench.returncode in (0, 1), bench.stderr  # 1: some requests hit the injected failures
    assert json.loads((tmp_path / "bench.json").read_text())["endpoint"] == server.url.replace("http://", "http://alice:***@")
    streams = [generated.stdout, generated.stderr, bench.stdout, bench.stderr, unreachable.stdout, unreachable.stderr]
    files = [path for path in tmp_path.rglob("*") if path.is_file() and path != prompts]
    assert len(files) >= 4
    leaks = [path.name for path in files if SECRET in path.read_text(errors="replace")]
    leaks += [f"stream {i}" for i, text in enumerate(streams) if SECRET in text]
    assert leaks == []
