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
