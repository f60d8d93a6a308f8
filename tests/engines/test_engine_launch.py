"""The launcher itself: readiness, clear start errors, kill and restart on the same port."""

from __future__ import annotations

import httpx
import pytest

from draftsmith.engines import EngineStartError

pytestmark = pytest.mark.timeout(120)


def test_kill_then_restart_serves_again_on_the_same_port(make_llama_server):
    server = make_llama_server(parallel=2, ctx_size=2048).start()
    port, first_pid = server.port, server.pid
    assert httpx.get(f"{server.api_url}/models", timeout=5).json()["data"][0]["id"] == "tiny"

    server.kill()
    assert not server.alive()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.base_url}/health", timeout=2)

    server.start()
    assert server.alive() and server.port == port and server.pid != first_pid
    assert server.starts == 2
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200


def test_a_failed_start_reports_the_engine_log(make_llama_server, tmp_path):
    missing = tmp_path / "missing.gguf"
    server = make_llama_server(gguf=missing, startup_timeout_s=30)
    with pytest.raises(EngineStartError) as caught:
        server.start()
    message = str(caught.value)
    assert "llama-server exited" in message
    assert "failed to load model" in message  # llama-server's own words, from its log
    assert not server.alive()


# A stand-in "engine" needs no install: Python's http.server answers /health and /v1/models with
# 200 from files, exactly the answers the launcher used to take as proof of readiness.
_SERVE = "import http.server, sys; sys.argv = ['x', sys.argv[1], '--bind', '127.0.0.1', '--directory', sys.argv[2]]; import runpy; runpy.run_module('http.server', run_name='__main__')"
_SPAWN_FOREIGN = (
    "import subprocess, sys, time; "
    "p = subprocess.Popen([sys.executable, '-m', 'http.server', sys.argv[1], '--bind', '127.0.0.1', "
    "'--directory', sys.argv[2]], start_new_session=True); "
    "open(sys.argv[3], 'w').write(str(p.pid)); time.sleep(120)"
)


@pytest.fixture
def answering_dir(tmp_path):
    site = tmp_path / "site"
    (site / "v1").mkdir(parents=True)
    (site / "health").write_text("ok")
    (site / "v1" / "models").write_text('{"data": [{"id": "tiny"}]}')
    return site


def _wait_listening(port: int, timeout_s: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not _accepts(port):
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.1)


def _accepts(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_server_we_started_is_ready_when_it_owns_the_port(answering_dir, tmp_path):
    import sys

    from draftsmith.engines import EngineServer
    from draftsmith.engines.launch import free_port, port_owned_by_session

    port = free_port()
    server = EngineServer("stand-in", [sys.executable, "-c", _SERVE, str(port), str(answering_dir)], port=port,
                          model_name="tiny", log_path=tmp_path / "own.log", startup_timeout_s=30)
    with server:
        assert server.alive() and port_owned_by_session(server.pid, "127.0.0.1", port) is True
        assert port_owned_by_session(1, "127.0.0.1", port) is False


def test_a_foreign_server_already_on_the_port_is_refused(answering_dir, tmp_path):
    import subprocess
    import sys

    from draftsmith.engines import EngineServer
    from draftsmith.engines.launch import free_port

    port = free_port()
    foreign = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                "--directory", str(answering_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        server = EngineServer("stand-in", [sys.executable, "-c", "import time; time.sleep(60)"], port=port,
                              model_name="tiny", log_path=tmp_path / "refused.log", startup_timeout_s=30, port_wait_s=1)
        with pytest.raises(EngineStartError, match=f"port {port} is still in use"):
            server.start()
        assert not server.alive()
    finally:
        foreign.kill()
        foreign.wait()


def test_a_foreign_server_that_takes_the_port_during_start_is_not_ready(answering_dir, tmp_path):
    """The race the old check lost: our process is alive, the port answers 200, but someone else owns it."""
    import os
    import signal
    import sys

    from draftsmith.engines import EngineServer
    from draftsmith.engines.launch import free_port

    port = free_port()
    pid_file = tmp_path / "foreign.pid"
    server = EngineServer("stand-in", [sys.executable, "-c", _SPAWN_FOREIGN, str(port), str(answering_dir), str(pid_file)],
                          port=port, model_name="tiny", log_path=tmp_path / "race.log", startup_timeout_s=30)
    try:
        with pytest.raises(EngineStartError, match="not the stand-in process we started"):
            server.start()
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200  # it did answer
        assert not server.alive()
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("port", ["70000", "-1", "0"])
def test_a_port_outside_tcp_is_one_line_before_anything_starts(port):
    """`engines start --port 70000` or `-1` was a traceback (issue 34 item 8); needs no engine installed."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "draftsmith.engines", "start", "llama-server", "--port", port],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"draftsmith: error: --port {port}: not a TCP port (1 to 65535); leave it out for a free one"
