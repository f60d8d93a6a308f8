"""Real engines for the integration tests: one vLLM CPU server and one llama-server per session.

The engines are installed outside the repo by `engines/*.sh` (`.ci/run` runs them). Without them,
these tests skip locally with the command to run; in CI (`CI=true`) or with
`DRAFTSMITH_REQUIRE_ENGINES=1` they fail instead, so a broken install can never pass as green.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from draftsmith.engines import (
    EngineNotInstalled,
    EngineServer,
    convert_to_gguf,
    llama_server,
    vllm_server,
)

ENGINES = ("vllm", "llama-server")
_extra_server_numbers = itertools.count()


def engines_required() -> bool:
    ci = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
    return ci or os.environ.get("DRAFTSMITH_REQUIRE_ENGINES", "").strip() == "1"


def engine_unavailable(message: str):
    if engines_required():
        pytest.fail(
            f"{message}\n(real engines are required here: CI=true or DRAFTSMITH_REQUIRE_ENGINES=1)",
            pytrace=False,
        )
    pytest.skip(message)


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def engine_log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="session")
def tiny_gguf(tiny_target_dir) -> Path:
    try:
        return convert_to_gguf(tiny_target_dir)
    except EngineNotInstalled as error:
        engine_unavailable(str(error))


def _started(server: EngineServer) -> EngineServer:
    began = time.monotonic()
    server.start()
    print(f"\n{server.kind} ready on {server.api_url} in {time.monotonic() - began:.1f} s")
    return server


def _session_server(make_server, model: Path, log_path: Path):
    try:
        server = make_server(model, log_path=log_path)
    except EngineNotInstalled as error:
        engine_unavailable(str(error))
    try:
        yield _started(server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _vllm_session(tiny_target_dir, engine_log_dir):
    yield from _session_server(vllm_server, tiny_target_dir, engine_log_dir / "vllm.log")


@pytest.fixture(scope="session")
def _llama_session(tiny_gguf, engine_log_dir):
    yield from _session_server(llama_server, tiny_gguf, engine_log_dir / "llama-server.log")


def _running(server: EngineServer) -> EngineServer:
    # A kill test may have left it dead; every test gets a live engine, on the same port.
    if not server.alive():
        server.start()
    return server


@pytest.fixture
def vllm_engine(_vllm_session) -> EngineServer:
    return _running(_vllm_session)


@pytest.fixture
def llama_engine(_llama_session) -> EngineServer:
    return _running(_llama_session)


@pytest.fixture(params=ENGINES)
def engine(request) -> EngineServer:
    """Each test using it runs once against vLLM and once against llama-server."""
    return request.getfixturevalue("vllm_engine" if request.param == "vllm" else "llama_engine")


@pytest.fixture
def make_llama_server(tiny_gguf, engine_log_dir):
    """Start extra llama-servers (cheap: ready in well under a second) that the test may kill."""
    servers: list[EngineServer] = []

    def make(gguf: Path | None = None, **options) -> EngineServer:
        try:
            server = llama_server(
                gguf or tiny_gguf, log_path=engine_log_dir / f"llama-extra-{next(_extra_server_numbers)}.log", **options
            )
        except EngineNotInstalled as error:
            engine_unavailable(str(error))
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def start_vllm(engine_log_dir):
    """Start extra vLLM servers (about 20-100 s each) for one test module; all stop at its end."""
    servers: list[EngineServer] = []

    def start(model: Path, name: str, **options) -> EngineServer:
        try:
            server = vllm_server(model, log_path=engine_log_dir / f"vllm-{name}.log", **options)
        except EngineNotInstalled as error:
            engine_unavailable(str(error))
        servers.append(server)
        return _started(server)

    yield start
    for server in servers:
        server.stop()
