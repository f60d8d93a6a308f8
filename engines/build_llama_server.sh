#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the llama.cpp vendored in the pinned llama-cpp-python sdist
# (PyPI is the only source registry reachable here). Idempotent: the binary is cached and rebuilt
# only when the pinned version changes.
# Results under $ENGINES_DIR/llama.cpp/:
#   bin/llama-server        the server binary
#   paths.env               LLAMA_SERVER=..., LLAMA_CONVERT_HF_TO_GGUF=..., LLAMA_GGUF_PY=...
set -euo pipefail
source "$(dirname "$0")/common.sh"

ROOT="$ENGINES_DIR/llama.cpp"
SDIST_DIR="$ROOT/sdist"
SRC="$ROOT/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
BUILD="$ROOT/build-$LLAMA_CPP_PYTHON_VERSION"
BIN="$ROOT/bin/llama-server"
STAMP="$ROOT/bin/.draftsmith-stamp"
WANT="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
JOBS="${DRAFTSMITH_BUILD_JOBS:-$(nproc)}"

write_paths() {
    local vendor="$SRC/vendor/llama.cpp"
    cat > "$ROOT/paths.env" <<ENV
LLAMA_SERVER=$BIN
LLAMA_CONVERT_HF_TO_GGUF=$vendor/convert_hf_to_gguf.py
LLAMA_GGUF_PY=$vendor/gguf-py
ENV
}

if [ -x "$BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
        && [ -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ] && "$BIN" --version >/dev/null 2>&1; then
    write_paths
    log "llama-server already built: $BIN ($WANT)"
    exit 0
fi

start=$(date +%s)
mkdir -p "$SDIST_DIR" "$ROOT/src" "$ROOT/bin"
sdist=$(ls "$SDIST_DIR"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz 2>/dev/null || true)
if [ -z "$sdist" ]; then
    log "downloading the $WANT sdist"
    pip_filtered "$ENGINES_PYTHON" -m pip download --quiet --no-binary :all: --no-deps --dest "$SDIST_DIR" "$WANT"
    sdist=$(ls "$SDIST_DIR"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz)
fi
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    rm -rf "$SRC"
    tar -xzf "$sdist" -C "$ROOT/src"
fi

for tool in cmake c++; do
    command -v "$tool" >/dev/null || { log "error: $tool is needed to build llama-server (apt-get install cmake g++)"; exit 1; }
done
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

log "building llama-server with $JOBS jobs (a few minutes on 2 cores)"
# Static, no tests/examples/web UI/OpenSSL: the server is all we need and nothing may be downloaded.
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >"$ROOT/cmake-configure.log" 2>&1 \
    || { tail -n 40 "$ROOT/cmake-configure.log" >&2; exit 1; }
cmake --build "$BUILD" --target llama-server -j "$JOBS" >"$ROOT/cmake-build.log" 2>&1 \
    || { tail -n 40 "$ROOT/cmake-build.log" >&2; exit 1; }
install -m 0755 "$BUILD/bin/llama-server" "$BIN"
"$BIN" --version >&2
echo "$WANT" > "$STAMP"
write_paths
log "llama-server built in $(( $(date +%s) - start )) s: $BIN"
