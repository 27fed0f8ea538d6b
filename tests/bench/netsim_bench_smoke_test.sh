#!/usr/bin/env bash
# Keeps the network benchmark working: one small payload over loopback and a 100mbit link, then
# 2 servers x 2 clients on four hosts, one short run (no timing is checked). Skips, saying why, where network namespaces cannot be made.
set -euo pipefail
bench="$TEST_SRCDIR/pscluster/tests/bench/netsim_bench"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED: netsim_bench needs root to make network namespaces"
  exit 0
fi
out="$TEST_TMPDIR/report.md"
"$bench" --runs=1 --min_run_sec=0 --sizes=262144 --rates=100mbit --out="$out"
grep -q "| 256 KiB | loopback (baseline) |" "$out"
grep -q "| 256 KiB | 100mbit |" "$out"
grep -q "^2 ps_servers x 2 clients" "$out"
[ "$(grep -c '^| 256 KiB | 100mbit |' "$out")" -eq 2 ]
