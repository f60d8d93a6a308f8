#!/usr/bin/env bash
# Install every real engine the integration tests use (tests/engines), cached outside the repo.
# vLLM's install is mostly download and unpacking, llama-server's build is CPU: run them together.
# Usage: bash engines/install_all.sh [PYTHON]   (PYTHON: one with draftsmith's dependencies)
set -euo pipefail
here="$(dirname "$0")"
start=$(date +%s)
bash "$here/install_vllm.sh" &
vllm_pid=$!
bash "$here/build_llama_server.sh"
wait "$vllm_pid"
bash "$here/convert_tiny_gguf.sh" "${1:-python3}"
echo "[engines] all engines ready in $(( $(date +%s) - start )) s" >&2
