#!/usr/bin/env bash
# Set up (first time only) and start the assistant. Arguments go to `assistant`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode is kept even where the environment sets PYTHONDONTWRITEBYTECODE: without it every
# start compiles ~250 modules again (~0.5 s; docs/benchmarks.md "Bytecode kept").
unset PYTHONDONTWRITEBYTECODE
scripts/setup.sh
exec .venv/bin/assistant "$@"
