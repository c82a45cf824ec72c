#!/usr/bin/env bash
# Each mutation of engines/tensorrt/runtime.py against the stand-in suite of a tree.
# usage: docs/results/trt-standin-mutations/run.sh TREE PATCH_DIR TESTS...
# TREE (a git checkout) is copied; the copy gets each patch in turn; the tree itself is untouched.
# The logs here: run.sh /tmp/old-head docs/results/trt-standin-mutations tests/unit/test_tensorrt_{runtime_on_standin,rebuild_policy}.py
# (before: HEAD 14bee4f exported with git archive), and the same with this branch and test_tensorrt_standin_strictness.py (after).
set -u
tree=$1; patches=$(realpath "$2"); shift 2
py=${PYTHON:-/work/main/.venv/bin/python}
for patch in "$patches"/*.patch; do
  work=$(mktemp -d)
  (cd "$tree" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$work" 2>/dev/null)
  (cd "$work" && patch -s -p1 < "$patch") || { echo "$(basename "$patch"): does not apply"; continue; }
  out=$(cd "$work" && PYTHONPATH=$work nice -n 10 "$py" -m pytest -q -rfE -p no:cacheprovider "$@" 2>&1)
  printf '%-40s %s\n' "$(basename "$patch" .patch)" "$(tail -1 <<<"$out")"
  grep -E "^(FAILED|ERROR)" <<<"$out" | sed 's/^/    /' | cut -c1-240
  rm -rf "$work"
done
