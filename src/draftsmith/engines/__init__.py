"""Real inference engines (vLLM CPU, llama.cpp's llama-server) as local subprocesses.

Install them with the scripts in the repo's `engines/` folder; see `draftsmith.model.engine_install`.
"""

from draftsmith.engines.gguf import GGUFConversionError, convert_to_gguf
from draftsmith.model.engine_install import (
    EngineNotInstalled,
    engines_dir,
    llama_convert_script,
    llama_server_binary,
    vllm_python,
)
from draftsmith.engines.launch import EngineServer, EngineStartError, free_port, llama_server, vllm_server

__all__ = [
    "EngineNotInstalled",
    "EngineServer",
    "EngineStartError",
    "GGUFConversionError",
    "convert_to_gguf",
    "engines_dir",
    "free_port",
    "llama_convert_script",
    "llama_server",
    "llama_server_binary",
    "vllm_python",
    "vllm_server",
]
