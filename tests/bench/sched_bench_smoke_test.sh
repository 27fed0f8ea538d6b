#!/usr/bin/env bash
# Runs the scheduler benchmark on a tiny configuration and checks that it reports every section.
set -euo pipefail
out="$("$TEST_SRCDIR/pscluster/tests/bench/sched_bench" --nodes=20 --seconds=0.3 --warmup=50ms \
  --sim_servers=50 --sim_workers=200 --sim_shards=1024 --sim_repeats=1)"
echo "$out"
for want in "Heartbeat p99 / baseline p99" "RegisterNode latency" "Placement scale simulation"; do
  grep -q "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
! grep -q "INVALID MAP" <<<"$out"
