#!/usr/bin/env bash
# Convert the built-in tiny target to GGUF for llama-server (after build_llama_server.sh).
# Usage: bash engines/convert_tiny_gguf.sh [PYTHON]   (PYTHON: one with draftsmith's dependencies)
# Cached by content under $ENGINES_DIR/gguf/; prints the GGUF path.
set -euo pipefail
source "$(dirname "$0")/common.sh"
PYTHON="${1:-python3}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m draftsmith.engines gguf
