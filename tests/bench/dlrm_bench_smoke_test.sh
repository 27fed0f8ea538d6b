#!/usr/bin/env bash
# Runs the DLRM benchmark on a small generated set and checks that both rows are reported with
# finite numbers and a test AUC above chance. No timing is checked.
set -euo pipefail
bin="$TEST_SRCDIR/pscluster/tests/bench/dlrm_bench"
out="$(RUNFILES_DIR="$TEST_SRCDIR" "$bin" --train_examples=30000 --test_examples=3000 --cpu_threads=1)"
echo "$out"
for want in "| one process, no parameter server |" "| 1 server x 1 worker (BSP, TCP data port) |" \
  "planted_test_auc"; do
  grep -qF "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
if grep -qiE '\b(nan|inf)\b' <<<"$out"; then echo "non-finite value"; exit 1; fi
# Both rows learned something: a test AUC above 0.6 (the planted ceiling is near 0.9).
awk -F'|' '/^\| (one process|1 server)/ { if ($5 + 0 < 0.6) { print "AUC too low:", $0; bad = 1 } }
  END { exit bad }' <<<"$out"
