#!/usr/bin/env bash
# Set up (first time only) and run the checks and the test suite. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python keeps the bytecode of what it imports (.venv and the source tree, both ours): where the
# environment sets PYTHONDONTWRITEBYTECODE, every test process and every app the tests start
# would compile the same modules again (7 s of each pytest process's collection, ~0.5 s of
# each start of the app; docs/benchmarks.md "Bytecode kept").
unset PYTHONDONTWRITEBYTECODE
# OpenMP threads (torch's, CTranslate2's) sleep while they wait for work instead of spinning:
# the workers share two cores, and a spinning thread burns what the other workers need
# (the suite's CPU 1,106 -> 1,013 s in one run each; docs/benchmarks.md "Passive OpenMP waits").
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
scripts/setup.sh --dev
echo "[test] ruff"; .venv/bin/ruff check assistant bench engines models store scripts tests setup_gpu.py
echo "[test] import contracts"; .venv/bin/lint-imports
# mypy (~30 s of one core without its cache, as in a fresh clone) runs beside pytest, whose
# workers leave a core idle much of the time; its report follows pytest's.
mypy_log=$(mktemp)
trap 'rm -f "$mypy_log"' EXIT
echo "[test] mypy (beside pytest)"; nice -n 19 .venv/bin/mypy >"$mypy_log" 2>&1 & mypy_pid=$!
# Three workers: the tests on the virtual sound devices (real time, mostly waiting) beside two
# lanes of the others at the lowest CPU priority, which use what the audio tests leave idle
# (tests/conftest.py); ASSISTANT_TEST_WORKERS=0 runs everything in one process.
workers=${ASSISTANT_TEST_WORKERS:-3}
parallel=()
(( workers > 0 )) && parallel=(-n "$workers")
echo "[test] pytest"; status=0
.venv/bin/python -m pytest "${parallel[@]}" "$@" || status=$?
echo "[test] mypy"; mypy_status=0; wait "$mypy_pid" || mypy_status=$?
cat "$mypy_log"
(( status )) && exit "$status"
exit "$mypy_status"
