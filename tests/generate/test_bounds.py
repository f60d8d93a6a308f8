"""Numbers bounded by the work (issue 27, item 7): a huge --concurrency on a few prompts, and rows
over the row-size limit, through real `draftsmith generate` / `bench` / `audit` processes."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from draftsmith.serve.process import ServeProcess

from .conftest import read_rows

SRC = Path(__file__).resolve().parents[2] / "src"
ADDRESS_SPACE = 3 * 1024**3  # a run that creates workers per unit of --concurrency dies here, not in the machine's RAM


def run(args: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    environment = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="200", OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True, env=environment,
                          timeout=timeout, preexec_fn=limit_memory)


def test_a_billion_concurrency_on_four_prompts_starts_four_workers(tmp_path, prompts_file):
    prompts = prompts_file(4)
    with ServeProcess(["--backend", "echo"]) as server:
        result = run(["generate", str(prompts), "-o", str(tmp_path / "out"), "-e", server.url, "--no-progress",
                      "--concurrency", "1000000000", "--json"])
        assert result.returncode == 0, result.stderr[-2000:]
        assert len(read_rows(tmp_path / "out")) == 4
        bench = run(["bench", str(prompts), "-e", server.url, "--concurrency", "1000000000", "--no-warmup"])
    assert bench.returncode == 2 and "Traceback" not in bench.stderr, bench.stderr[-2000:]
    assert bench.stderr.strip().splitlines()[-1].startswith("draftsmith: error: --concurrency 1000000000: above 65,536")


def test_rows_over_the_row_size_limit_are_counted_and_skipped_by_every_reader(tmp_path, prompts_file):
    prompts = prompts_file(4)
    huge = {"id": "huge", "messages": [{"role": "user", "content": "x" * 3_000_000}]}
    lines = prompts.read_text().splitlines()
    prompts.write_text("\n".join(lines[:2] + [json.dumps(huge)] + lines[2:]) + "\n")
    limit = {"DRAFTSMITH_MAX_ROW_BYTES": "1000000"}
    skipped = f"{prompts}:3: a row of 3,000,"
    with ServeProcess(["--backend", "echo"]) as server:
        result = run(["generate", str(prompts), "-o", str(tmp_path / "out"), "-e", server.url, "--no-progress", "--json"],
                     env=limit)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(row["id"] for row in read_rows(tmp_path / "out")) == sorted(json.loads(line)["id"] for line in lines)
    assert skipped in result.stderr and "row-size limit" in result.stderr, result.stderr[-2000:]
    audit = run(["audit", str(prompts), "--json"], env=limit)
    report = json.loads(audit.stdout)
    assert skipped in json.dumps(report), audit.stdout[-3000:]
