#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py says what each row measures): under 5 minutes on one
# H100/H200; `--cpu-smoke` runs the same steps small on the CPU. Exit 0 all ok, 1 a row failed,
# 2 no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
exec timeout 900 "$python" benchmarks/gpu_check.py "$@"
