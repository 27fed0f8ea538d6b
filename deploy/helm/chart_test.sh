#!/usr/bin/env bash
# Runs chart_test.py (Bazel 4's py_test would need a Python toolchain download).
set -euo pipefail
root="${TEST_SRCDIR}/pscluster"
exec python3 "$root/deploy/helm/chart_test.py" "$root/deploy/helm/pscluster" "$root"
