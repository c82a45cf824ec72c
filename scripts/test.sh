#!/usr/bin/env bash
# Set up (first time only) and run the checks and the test suite. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
echo "[test] ruff"; .venv/bin/ruff check assistant bench engines models store scripts tests setup_gpu.py
echo "[test] import contracts"; .venv/bin/lint-imports
echo "[test] mypy"; .venv/bin/mypy
echo "[test] pytest"; .venv/bin/python -m pytest "$@"
