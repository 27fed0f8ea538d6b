#!/usr/bin/env bash
# Runs the data-plane benchmark on a tiny configuration (one run, small payloads) and checks that
# it reports every section with numbers. No timing is checked.
set -euo pipefail
bin="$TEST_SRCDIR/pscluster/tests/bench/ps_bench"
out="$("$bin" --quick --runs=1 --sizes=4096,262144 \
  --server_binary="$TEST_SRCDIR/pscluster/server/ps_server")"
echo "$out"
for want in "Dense, 1 server x 1 client" "Dense, 2 servers x 2 clients" "TCP echo: 2 / 1" \
  "Sparse: 1k-row requests" "Optimizer apply" "Where a push-pull round goes"; do
  grep -q "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
# Every table row of both payloads is there, with finite numbers.
[ "$(grep -c '^| 256 KiB' <<<"$out")" -ge 3 ] || { echo "missing 256 KiB rows"; exit 1; }
if grep -qiE '\b(nan|inf)\b' <<<"$out"; then echo "non-finite value"; exit 1; fi
