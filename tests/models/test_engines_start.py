"""`python -m draftsmith.engines start llama-server --model M` serves M under its own name (it served
every model as "tiny") with the threads asked for (it always ran one)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _start(*args: str) -> tuple[subprocess.Popen, str, Path, list[str]]:
    process = subprocess.Popen([sys.executable, "-m", "draftsmith.engines", "start", "llama-server", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": SRC})
    ready = process.stdout.readline()  # "llama-server ready in 1.2 s: http://127.0.0.1:PORT/v1 (model 'NAME')"
    if not ready:
        process.wait(timeout=30)
        raise AssertionError(process.stderr.read())
    said = []  # stderr up to "starting llama-server (log: PATH) ...": the thread count chosen, where it was
    while not (found := re.search(r"\(log: (\S+)\)", said[-1] if said else "")):
        said.append(process.stderr.readline())
        assert said[-1], said
    return process, ready, Path(found.group(1)), said


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def test_a_fetched_gguf_is_served_under_its_name_with_the_threads_asked_for(smollm2):
    from draftsmith.engines import EngineNotInstalled, llama_server

    from real_model import unavailable

    try:
        llama_server(smollm2.gguf)  # only resolves the binary
    except EngineNotInstalled as error:
        unavailable(str(error))
    process, ready, log, said = _start("--model", str(smollm2.gguf), "--threads", "2")
    try:
        assert ready.rstrip().endswith("(model 'smollm2-135m')"), ready
        url = re.search(r"(http://\S+/v1)", ready).group(1)
        with urllib.request.urlopen(f"{url}/models", timeout=10) as response:
            assert [m["id"] for m in json.loads(response.read())["data"]] == ["smollm2-135m"]
        command = next(line for line in log.read_text().splitlines() if line.startswith("==== draftsmith: starting"))
        assert " -t 2 " in command and " -a smollm2-135m " in command, command
    finally:
        _stop(process)
    process, ready, log, said = _start("--model", str(smollm2.gguf), "--name", "mine")
    try:
        assert ready.rstrip().endswith("(model 'mine')"), ready
        # Without --threads: one per CPU the machine's load leaves idle, said on stderr and used.
        (chosen,) = [line for line in said if line.startswith("llama-server threads: ")]
        threads = int(chosen.split()[2])
        assert "1-minute load" in chosen and 1 <= threads <= len(os.sched_getaffinity(0)), chosen
        command = [line for line in log.read_text().splitlines() if line.startswith("==== draftsmith: starting")][-1]
        assert f" -t {threads} " in command, command
    finally:
        _stop(process)
