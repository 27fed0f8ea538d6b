#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. every test of the workspace (GPU tests report as skipped on machines without a device);
#   2. the CPU-only build: the kernels again with the CUDA toolkit hidden through the toolkit
#      rule's override variable, in a separate output base so the main build stays cached.
set -euo pipefail
cd "$(dirname "$0")/.."

BAZEL_FLAGS=()
# The tiers that start real daemons as separate processes (tests/cluster, tests/integration,
# tests/netsim, tests/browser) wait on heartbeats, leases and sockets on a machine whose two
# cores they share with each other: a run that fails there is run once more, and Bazel reports a
# test that passed only then as FLAKY in the summary (look for it: it is a finding, not a pass).
# Every other test runs once.
for tier in cluster integration netsim browser; do
  BAZEL_FLAGS+=("--flaky_test_attempts=^//tests/${tier}[:/].*@2")
done
if [ -n "${CI:-}" ]; then
  BAZEL_FLAGS+=(--noshow_progress --curses=no)
fi

echo "== bazel test //... =="
bazel test "${BAZEL_FLAGS[@]}" //...

echo "== CPU-only build (PSCLUSTER_CUDA_PATH=none) =="
nocuda_base="${PSCLUSTER_NOCUDA_OUTPUT_BASE:-${HOME:-/tmp}/.cache/pscluster-bazel-nocuda}"
bazel --output_base="$nocuda_base" test "${BAZEL_FLAGS[@]}" \
  --repo_env=PSCLUSTER_CUDA_PATH=none //kernels/...
