#!/usr/bin/env bash
# Runs a Python test of the pscluster package under Bazel: Debian's /usr/bin/python3 (which has
# python3-numpy and python3-torch; Bazel 4's py_test would need a Python toolchain download),
# with the built package (//python:pscluster) and these helpers on PYTHONPATH.
# Usage (sh_test args): run_py_test.sh SCRIPT [ARGS...], SCRIPT relative to the workspace.
set -euo pipefail
root="${TEST_SRCDIR}/pscluster"
py=python3
for p in /usr/bin/python3 python3; do
  if "$p" -c "import numpy, torch" 2>/dev/null; then py="$p"; break; fi
done
export PYTHONPATH="${root}/python/pkg:${root}/python/tests${PYTHONPATH:+:$PYTHONPATH}"
script="$1"
shift
exec "$py" -u "${root}/${script}" "$@"
