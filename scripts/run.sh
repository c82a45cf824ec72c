#!/usr/bin/env bash
# Set up (first time only) and start the assistant. Arguments go to `assistant`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/assistant "$@"
