#!/usr/bin/env bash
# Runs the data reader benchmark on small files and checks that it reports every format and the
# memory pass with numbers. No timing is checked.
set -euo pipefail
bin="$TEST_SRCDIR/pscluster/tests/bench/data_reader_bench"
out="$("$bin" --mb=2 --runs=1 --rss_gb=0.02 --rss_dir="$TEST_TMPDIR")"
echo "$out"
for want in "| LibSVM |" "| CSV |" "| Criteo |" "Peak RSS while streaming" \
  "peak RSS during the pass"; do
  grep -qF "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
if grep -qiE '\b(nan|inf)\b' <<<"$out"; then echo "non-finite value"; exit 1; fi
# The memory pass deleted its file.
! ls "$TEST_TMPDIR"/pscluster_rss_* 2>/dev/null
