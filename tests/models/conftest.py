"""The real SmolLM2-135M-Instruct target for tests/models, from the cache `.ci/run` fills.

Tests that need it skip locally with the command to run; in CI (`CI=true`) or with
`DRAFTSMITH_REQUIRE_ENGINES=1` they fail instead, like tests/engines: a broken fetch is never green.
"""

from __future__ import annotations

import pytest

from real_model import FETCH_COMMAND, unavailable


@pytest.fixture(scope="session")
def smollm2():
    """The fetched model (`.hf_dir`, `.gguf`); never downloads (that is `.ci/run`'s job)."""
    from draftsmith.models import cached_model

    fetched = cached_model("smollm2-135m")
    if fetched is None:
        unavailable(f"SmolLM2-135M-Instruct is not in the cache; run: {FETCH_COMMAND}")
    return fetched


@pytest.fixture(scope="session")
def smollm2_llama_server(smollm2, tmp_path_factory):
    """llama-server serving SmolLM2's GGUF under its own name, one slot per request in flight."""
    from draftsmith.engines import EngineNotInstalled, llama_server

    try:
        server = llama_server(smollm2.gguf, alias="smollm2-135m", threads=2, parallel=4, ctx_size=8192,
                              reasoning_format="none",
                              log_path=tmp_path_factory.mktemp("engine-logs") / "llama-smollm2.log")
    except EngineNotInstalled as error:
        unavailable(str(error))
    with server:
        yield server
