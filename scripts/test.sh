#!/usr/bin/env bash
# Set up (first time only) and run the checks and the test suite. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
echo "[test] ruff"; .venv/bin/ruff check assistant bench engines models store scripts tests setup_gpu.py
echo "[test] import contracts"; .venv/bin/lint-imports
echo "[test] mypy"; .venv/bin/mypy
# Two workers: the tests on the virtual sound devices (real time, mostly waiting) beside the
# compute-bound ones at the lowest CPU priority (tests/conftest.py); ASSISTANT_TEST_WORKERS=0
# runs everything in one process.
workers=${ASSISTANT_TEST_WORKERS:-2}
parallel=()
(( workers > 0 )) && parallel=(-n "$workers")
echo "[test] pytest"; .venv/bin/python -m pytest "${parallel[@]}" "$@"
