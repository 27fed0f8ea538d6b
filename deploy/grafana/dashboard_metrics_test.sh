#!/usr/bin/env bash
# Runs dashboard_metrics_test.py (Bazel 4's py_test would need a Python toolchain download).
set -euo pipefail
exec python3 "${TEST_SRCDIR}/pscluster/deploy/grafana/dashboard_metrics_test.py"
